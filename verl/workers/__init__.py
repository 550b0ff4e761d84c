"""Worker-side code: training engines, actor, critic, rollout engines and their configs."""
