"""The front end (paper 2.1): the /v1 REST API users, agents and the other replicas call. It
validates what comes in, routes a job's work to the leader of its shard, and answers from the
region's view; app.py lists its routes and the modules that serve them."""
