"""The workers a server runs turns on.

``pool`` knows the live workers of each agent and picks one for a turn;
``relay`` carries many turns' events from a worker on one long stream.
"""
