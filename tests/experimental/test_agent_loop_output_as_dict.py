"""``AgentLoopOutput.as_dict``: teacher columns move out of ``extra_fields`` without touching the model."""

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput


def test_as_dict_promotes_teacher_fields_and_leaves_the_output_alone():
    output = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3], response_mask=[1])
    assert output.as_dict()["extra_fields"] == {}
    output.extra_fields.update({"teacher_ids": [7], "teacher_logprobs": [-0.5], "raw": "x"})
    fields = output.as_dict()
    assert (fields["teacher_ids"], fields["teacher_logprobs"], fields["extra_fields"]) == ([7], [-0.5], {"raw": "x"})
    assert fields["prompt_ids"] == [1, 2] and fields["response_mask"] == [1] and fields["num_turns"] == 0
    assert output.extra_fields == {"teacher_ids": [7], "teacher_logprobs": [-0.5], "raw": "x"}


def test_single_turn_output_has_the_tool_loops_list_columns():
    import asyncio
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    class _Server:
        async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
            return SimpleNamespace(token_ids=[5, 6], log_probs=None, routed_experts=None, num_preempted=0,
                                   extra_fields={"engine": 1})  # fmt: skip

    rollout = {"prompt_length": 8, "response_length": 8, "multi_turn": {"tool_config_path": None}}
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout, "model": {"path": "m"}}, "data": {}})

    async def run():
        loop = SingleTurnAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=_Server(), tokenizer=None, processor=None,
            dataset_cls=None, data_config=DictConfigWrap(config.data),
        )  # fmt: skip
        return await loop.run({}, raw_prompt_ids=[1, 2])

    output = asyncio.run(run())
    assert output.extra_fields == {"turn_scores": [], "tool_rewards": [], "engine": 1}
    assert output.response_ids == [5, 6]
