"""TaskControl (paper 2.4, Figure 8): applications take part in their own lifecycle. A session per
job calls its TaskController with the operations that need its approval (session.py); a shard's
sessions (sessions.py); the SDK for writing controllers (sdk.py) and two of them (controllers/)."""
