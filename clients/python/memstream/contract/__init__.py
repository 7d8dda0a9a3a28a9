"""memstream's wire contract, shared by the server and its clients (the ``memstream-client``
distribution): the HTTP API's models and route paths (:mod:`.http_api`), the records a chat
service writes to Kafka (:mod:`.records`) and the root error (:mod:`.exceptions`).

It imports pydantic and the standard library only, never the server: the server imports it.
"""
