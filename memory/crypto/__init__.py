"""Per-user envelope encryption and the user-keys topic (forget-me by crypto-shredding)."""
