"""twine-agent: the node agent. It owns one host: its task containers and its host profile."""
