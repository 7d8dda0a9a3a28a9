"""A local OpenAI-compatible HTTP server with scripted replies (HTTP-path tests, benchmarks).

Each request to /v1/chat/completions or /v1/embeddings takes the next scripted reply:
``Reply(status, body)`` or ``Reply(delay=...)`` to answer too late. Requests are recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    delay: float = 0.0


def chat(content: str, prompt_tokens: int = 100, completion_tokens: int = 20) -> Reply:
    return Reply(200, {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


def chat_json(obj: Any, **kw: int) -> Reply:
    return chat(json.dumps(obj, ensure_ascii=False), **kw)


def error(status: int, message: str = "scripted error") -> Reply:
    return Reply(status, {"error": {"message": message, "type": "test", "code": status}})


class OpenAITestServer:
    def __init__(self, responder: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.script: list[Reply] = []
        self.responder = responder  # answers when the script is empty
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append((self.path, body))
                    if server.script:
                        reply = server.script.pop(0)
                    elif server.responder is not None:
                        reply = server.responder(body)
                    else:
                        reply = error(500, "no script")
                if reply.delay:
                    time.sleep(reply.delay)
                data = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> OpenAITestServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
