"""planner-api: the gRPC ``PlanService`` over a read model of plans, jobs and the causal
state (DESIGN §2: it owns nothing).

``readmodel`` holds what the bus has said (plans, job specs and rejections, the latest
deployments, the causal state) and answers queries on it, with no transport code;
``grpc_server`` is the ``PlanService`` servicer and ``serve`` (health checking and
server reflection included); ``main`` feeds the read model from NATS. No planning
decisions are made here.
"""
