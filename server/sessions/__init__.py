"""Sessions and their turns, on the server that owns them.

``core`` holds the sessions this server owns and places each turn;
``admission`` is what one turn request asks (built once, at the service);
``turns`` runs a session's turns under its policy, ``runner`` one turn on a
worker up to its commit; ``pauses`` is what a session waits for from the
client and the one check of the answers; ``eventlog`` keeps each turn's
events for resuming; ``history`` builds what a turn adds; ``validation``
refuses bad requests before anything changes; ``turn_records`` records
background turns and turns with a webhook.
"""
