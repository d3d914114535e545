"""Sessions and their turns, on the server that owns them.

``core`` holds the sessions this server owns and places each turn:
``admission`` is what one turn request asks (built once, at the service),
``quotas`` the limits a turn counts against; ``turns`` runs a session's
turns under its policy, ``runner`` one turn on a worker up to its commit;
``pauses`` is what a session waits for from the client and ``answers`` the
one check of the answers to it (and the table that names them in each
surface's words); ``eventlog`` keeps each turn's events for resuming;
``history`` builds what a turn adds; ``validation`` refuses bad requests
before anything changes; ``turn_records`` records background turns and
turns with a webhook, ``recorded`` reads them back and settles those whose
server died.
"""
