"""Sealed content and its keys (forget-me, SPEC §7), the part a downstream reader needs
and the workers share: the envelope (:mod:`.envelope`: AES-256-GCM blobs, the key
hierarchy master key -> tenant KEK -> user data key), the user-keys topic's record format
(:mod:`.key_records`) and a process's view of that topic (:mod:`.key_view`). Pure: no
I/O. Needs ``cryptography`` (the ``kafka`` extra of ``memstream-client``); the workers'
writes, the follower and the change events' sealing are the server's
(``memstream.memory.crypto``).
"""
