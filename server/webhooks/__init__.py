"""Webhooks: a turn's end told to the caller's URL.

``settings`` is what the operator allows (the flags, and the allow-list
every destination is checked against); ``outbox`` the notices waiting and
the contract each store's outbox keeps (with the memory store's own);
``sender`` delivers them, signed, with retries. Each imports only those
before it.
"""
