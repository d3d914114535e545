"""Webhooks: a turn's end told to the caller's URL.

``sender`` checks destinations against the allow-list, queues notices in
the store's outbox and delivers them, signed, with retries.
"""
