"""planner-api: the gRPC ``PlanService`` over a read model of plans, jobs and the causal
state (DESIGN §2: it owns nothing).

``readmodel`` holds what the bus has said (plans, job specs and rejections, the latest
deployments, the causal state, recent candidates) and answers queries on it, with no
transport code (``watch``: a WatchPlans queue; ``alternatives``: what-if arithmetic and
Explain's alternatives); ``grpc_server`` is the ``PlanService`` servicer and ``serve``
(``grpc.aio``, health checking and server reflection included), ``grpc_security`` its
TLS, bearer token and client channel, ``render`` the words and page tokens of its
answers; ``main`` feeds the read model from NATS. No planning decisions are made here.
"""
