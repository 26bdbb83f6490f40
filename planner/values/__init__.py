"""What a plan is made of: tasks and tensors (the IR's value types and their JSON), the
strategies, the resources a transfer crosses, requests as the planner takes them, the
scale tensors of scaled casts, and the plan's digest."""
