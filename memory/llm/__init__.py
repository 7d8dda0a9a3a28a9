"""The OpenAI-compatible memory model: its calls, its reflection step, its recorded answers."""
