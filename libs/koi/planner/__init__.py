"""The Koi planner: propose → evaluate → compose → place, as pure domain code."""
