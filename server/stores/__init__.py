"""Where sessions live: the store contract and its backends.

``base`` is the contract every store passes (``SessionStore``, the session
record, the commit's rules) and the in-memory store; ``sqlite`` keeps one
server's sessions in a file; ``redis`` shares them between servers, with
``redis_outbox`` its webhook outbox and ``redis_migrate`` its layout moves;
``listing`` is the keyset pages every backend lists sessions by.
"""
