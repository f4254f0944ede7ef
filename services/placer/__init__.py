"""placer: turns each tick's plan into actions against the fleet; owns job admission
and the tick's deadline (a late plan degrades the tick to the last good plan)."""
