"""A server among others: who owns a session, and how a call reaches it.

``ownership`` decides whether a call runs here or on the session's owner,
``routing`` asks the router, ``leases`` makes a shared store the last word
on ownership, ``forwarding`` carries a call to the owner; ``limits`` (with
``limits_redis``) holds request rates and turn quotas across the whole mesh
on a shared store.
"""
