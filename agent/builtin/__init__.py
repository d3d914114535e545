"""Built-in agents: ``echo`` (streams the message back) and ``demo`` (rule-based tools)."""
