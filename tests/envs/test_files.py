"""The `files` multi-turn environment: its backend, its tasks (every request changes the tree), scoring by state
(replaying the reference calls scores 100%, doing nothing 0%, in every call syntax), scripted and simulated
users (a model behind an OpenAI-compatible endpoint; its failure ends only its trajectory)."""

import asyncio

import pytest

from tests.fixtures.http_server import LocalHTTPServer
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.envs.files.backend import TOOL_NAMES, FileSystem
from toolrl.envs.files.tasks import canonical
from toolrl.errors import ConfigError
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.scripted import scripted_engine
from toolrl.tools import ToolExecutor
from toolrl.train.evaluate import summarize


def files_env(*overrides, parser=None):
    config = load_config(overrides=["env.name=files", "env.options.num_test=12", *overrides])
    return make_env(config.env, parser=parser)


def play(env, chat, tasks, idle=False):
    rollout = Rollout(env, None, chat, env.syntax, ToolExecutor(env.tools()), RolloutLimits(12, 256, 4000, 200))
    rollout.engine = scripted_engine("idle" if idle else "reference", chat, env.syntax, env)
    return rollout.run(tasks)


def test_the_backend_does_what_its_tools_say():
    fs = FileSystem({"a.txt": "one\ntwo\n", "docs": {}})
    assert fs.ls() == "a.txt  docs/" and fs.cd("docs") == "/docs" and fs.cd("..") == "/"
    fs.mv("a.txt", "docs")
    assert fs.root == {"docs": {"a.txt": "one\ntwo\n"}}
    fs.cp("docs/a.txt", "b.txt")
    fs.append("b.txt", "three")
    assert fs.cat("b.txt") == "one\ntwo\nthree\n" and fs.wc("b.txt").startswith("3 lines")
    assert fs.find("*.txt") == "b.txt\ndocs/a.txt" and fs.grep("tw", "b.txt") == "two"
    with pytest.raises(ValueError, match="folder 'docs' is not empty"):
        fs.rmdir("docs")
    with pytest.raises(ValueError, match=r"no file 'nope\.txt'"):
        fs.rm("nope.txt")
    assert len(TOOL_NAMES) == 24


def test_tasks_are_seeded_and_every_request_leaves_a_new_tree():
    env, again = files_env("env.options.num_train=300"), files_env("env.options.num_train=300")
    tasks = env.tasks("test") + env.tasks("train")
    assert [t.meta["requests"] for t in tasks[:12]] == [t.meta["requests"] for t in again.tasks("test")]
    for task in tasks:
        meta = task.meta
        assert 2 <= len(meta["requests"]) <= 4 and meta["requests"][0] == task.question
        used = {call["name"] for calls in meta["reference"] for call in calls}
        assert used | {"ls", "cd", "pwd", "cat"} <= set(meta["tools"]) < set(TOOL_NAMES)  # per-task tools
        states = [canonical(meta["tree"]), *meta["states"]]
        assert len(set(states)) == len(states) and states[-1] == task.answer  # each tree new: idling never passes
    with pytest.raises(ConfigError, match=r"min_requests is larger than env\.options\.max_requests"):
        files_env("env.options.min_requests=3", "env.options.max_requests=2")


@pytest.mark.parametrize("parser", ["hermes", "pythonic", "llama3-json"])
def test_replaying_the_reference_calls_scores_everything_and_doing_nothing_scores_nothing(chat, parser):
    env = files_env(parser=parser)
    tasks = env.tasks("test")
    replayed, idle = play(env, chat, tasks), play(env, chat, tasks, idle=True)
    assert summarize(replayed, "correct")["success"] == 1.0 and summarize(idle, "correct")["success"] == 0.0
    for traj in replayed:
        solved = [i["solved"] for i in traj.infos if "solved" in i]
        assert solved == [True] * len(traj.task.meta["requests"]) and traj.rewards["requests"] == 1.0
        kinds = [kind for kind, _, _ in traj.spans]
        assert kinds.count("user") == len(traj.task.meta["requests"]) - 1  # the user spoke again each time
        assert traj.user_messages == traj.task.meta["requests"][1:]
        assert traj.stop_reason == "no_tool_call" and sum(traj.turn_rewards) == len(traj.task.meta["requests"])
    assert all(t.rewards["requests"] == 0.0 for t in idle)


def test_a_simulated_user_asks_through_a_model_endpoint_and_its_failure_ends_only_its_trajectory(chat):
    with LocalHTTPServer() as server:  # its chat endpoint answers with the prompt in capitals
        env = files_env(
            "env.options.user=simulated",
            f"env.options.user_model={{base_url: '{server.url}/v1', model: m}}",
            "env.options.persona=You are Sam.",
        )
        tasks = env.tasks("test")[:2]
        [first, _] = play(env, chat, tasks)
        chats = [body["messages"] for _, path, _, body in server.requests if path == "/v1/chat/completions"]
    assert first.user_messages[0] == "DONE." and first.rewards["correct"] == 1.0  # what the user model wrote
    requests = tasks[0].meta["requests"]
    system, *heard = next(c for c in chats if requests[1] in c[0]["content"])
    assert (
        system["role"] == "system"
        and "You are Sam." in system["content"]
        and "Now ask for request 2" in system["content"]
    )
    # the whole conversation from the user's side, the roles turned: the greeting it answered, its question, the
    # assistant's reply
    opening = {"role": "user", "content": "Hi! How can I help you today?"}
    assert heard == [opening, {"role": "assistant", "content": requests[0]}, {"role": "user", "content": "Done."}]
    if len(requests) > 2:  # a later message: everything said before, not the last 500 characters
        later = next(c for c in chats if "Now ask for request 3" in c[0]["content"])
        assert [m["content"] for m in later[2:]] == [requests[0], "Done.", "DONE.", "Done."]
    assert first.user_tokens == 0 and first.timings["user_s"] > 0  # the endpoint reported no usage
    down = files_env(
        "env.options.user=simulated", "env.options.user_model={base_url: 'http://127.0.0.1:9/v1', model: m}"
    )
    trajs = play(down, chat, down.tasks("test")[:2])
    assert [t.stop_reason for t in trajs] == ["user_failed"] * 2 and all(t.env_fault for t in trajs)
    assert summarize(trajs, "correct")["stop/user_failed"] == 1.0 and summarize(trajs, "correct")["env_faults"] == 1.0
    with pytest.raises(ConfigError, match=r"env\.options\.user_model: a simulated user needs a model"):
        files_env("env.options.user=simulated")


def test_turn_states_for_gigpo_are_the_request_and_the_tree(chat):
    from toolrl.train.update import turn_inputs

    env = files_env()
    task = env.tasks("test")[0]
    a, b = play(env, chat, [task, task])
    ta, tb = turn_inputs(a), turn_inputs(b)
    assert [x.state for x in ta] == [x.state for x in tb]  # the same path: the same anchor states
    assert ta[1].state[0] == "env" and ta[1].state[1][0] == 0  # after the first calls: still request 0
    assert asyncio.iscoroutinefunction(env.reset(task).reply)


def test_a_task_shows_and_accepts_only_its_own_tools(chat, tokenizer):
    env = files_env()
    task = env.tasks("test")[0]
    with env.reset(task) as episode:
        offered = episode.available(ToolExecutor(env.tools()).tools)
    assert list(offered) == task.meta["tools"]
    rollout = Rollout(env, None, chat, env.syntax, ToolExecutor(env.tools()), RolloutLimits(2, 64, 4000, 200))
    prompt = tokenizer.decode(rollout.prompt_ids(task, env.messages(task), offered))
    missing = next(name for name in TOOL_NAMES if name not in task.meta["tools"])
    assert f'"name": "{missing}"' not in prompt and all(f'"name": "{n}"' in prompt for n in task.meta["tools"])


def test_tasks_from_a_file_are_honoured_or_refused_naming_the_field(tmp_path, chat):
    import json

    good = {
        "question": "Make a folder a.",
        "answer": "-",
        "tree": {"x.txt": "hi\n"},
        "requests": ["Make a folder a.", "Move x.txt into a."],
        "reference": [
            [{"name": "mkdir", "arguments": {"name": "a"}}],
            [{"name": "mv", "arguments": {"source": "x.txt", "destination": "a"}}],
        ],
    }
    (tmp_path / "tasks.jsonl").write_text(json.dumps(good) + "\n")
    env = files_env(f"env.test_file={tmp_path / 'tasks.jsonl'}")
    [task] = env.tasks("test")
    assert (
        task.answer == canonical({"a": {"x.txt": "hi\n"}})
        and summarize(play(env, chat, [task]), "correct")["success"] == 1.0
    )
    (tmp_path / "bad.jsonl").write_text(json.dumps({**good, "reference": good["reference"][:1]}) + "\n")
    from toolrl.errors import DataError

    with pytest.raises(
        DataError, match=r"env\.test_file: files task 0 has not one reference list of calls per request"
    ):
        files_env(f"env.test_file={tmp_path / 'bad.jsonl'}").tasks("test")


class LocalUserModel:
    """A local user model: it answers in batches only, recording each batch's size; `reply(i, batch)` makes the
    i-th answer of the batch-th batch, after `first()` (what the model does before it answers)."""

    def __init__(self, reply, first=lambda: None):
        self.batches, self.reply, self.first = [], reply, first

    def complete(self, messages):
        raise AssertionError("asked one by one")

    def complete_batch(self, conversations, seeds=None):
        self.batches.append(len(conversations))
        self.first()
        return [self.reply(i, len(self.batches)) for i in range(len(conversations))]


def test_a_local_simulated_user_answers_the_users_that_ask_together_in_one_batch():
    from toolrl.envs.users import Scenario, SimulatedUser, Transcript
    from toolrl.tools.model import Completion

    model = LocalUserModel(lambda i, batch: Completion(f"reply {i}", 10, 3))
    user = SimulatedUser(model)

    async def three_users():
        asks = [
            user.respond(Scenario("Ask for b."), Transcript([("user", "a"), ("assistant", f"said {i}")]))
            for i in range(3)
        ]
        return await asyncio.gather(*asks)

    said = asyncio.run(three_users())
    assert [s.text for s in said] == ["reply 0", "reply 1", "reply 2"] and model.batches == [3]
    assert all(s.tokens == 13 and not s.ended for s in said)


def test_a_user_who_asks_while_a_batch_is_being_answered_is_answered_in_the_next_one():
    """The hang a files-simulated run met: a conversation that reached its user turn while the local user model
    was answering a batch waited for another ask to flush it; when every other conversation was waiting too,
    none came and the evaluation stopped for good."""
    import threading

    from toolrl.envs.users import Scenario, SimulatedUser, Transcript
    from toolrl.tools.model import Completion

    answering = threading.Event()
    go_on = threading.Event()

    def slowly():  # the batch is being answered until the test lets it go on
        answering.set()
        go_on.wait(10)

    model = LocalUserModel(lambda i, batch: Completion(f"reply {batch}", 1, 1), first=slowly)
    user = SimulatedUser(model)

    def ask(i: int):
        return user.respond(Scenario("Ask for b."), Transcript([("user", "a"), ("assistant", f"said {i}")]))

    async def late_user():
        first = asyncio.ensure_future(ask(0))
        await asyncio.to_thread(answering.wait, 10)  # the first batch is being answered
        second = asyncio.ensure_future(ask(1))
        await asyncio.sleep(0.05)
        go_on.set()
        return await asyncio.wait_for(asyncio.gather(first, second), timeout=10)

    said = asyncio.run(late_user())
    assert [s.text for s in said] == ["reply 1", "reply 2"] and model.batches == [1, 1]


def test_a_sampling_simulated_user_gets_a_seed_per_message_from_the_episode(chat):
    """Each user message has its own named stream (seeds.py: the episode's "user", k): a rerun (a resumed run)
    sends the same seeds, another rollout seed others, and a greedy user model none."""
    with LocalHTTPServer() as server:

        def seeds_sent(rollout_seed, temperature=0.7):
            env = files_env(
                "env.options.user=simulated",
                f"env.options.user_model={{base_url: '{server.url}/v1', model: m, temperature: {temperature}}}",
            )
            tasks = env.tasks("test")[:2]
            rollout = Rollout(env, None, chat, env.syntax, ToolExecutor(env.tools()), RolloutLimits(12, 256, 4000, 200))
            rollout.engine = scripted_engine("reference", chat, env.syntax, env)
            server.requests.clear()
            rollout.run(tasks, seed=rollout_seed)
            sent = [body.get("seed") for _, path, _, body in server.requests if path == "/v1/chat/completions"]
            return sorted(sent, key=str)

        first = seeds_sent(11)
        assert len(first) >= 2 and None not in first and len(set(first)) == len(first)
        assert seeds_sent(11) == first and set(seeds_sent(12)).isdisjoint(first)
        assert set(seeds_sent(11, temperature=0)) == {None}


def test_a_local_user_model_that_samples_draws_each_reply_from_its_seed_whatever_the_batch(tiny_model_dir):
    from toolrl.tools.model import LocalChat

    local = LocalChat(str(tiny_model_dir), max_tokens=8, temperature=1.0)
    prompts = ["book a table", "cancel my order", "what is the time"]
    together = local.batch(prompts, [1, 2, 3])
    assert [local(p, seed=s) for p, s in zip(prompts, [1, 2, 3], strict=True)] == together
    assert local.batch(prompts[::-1], [3, 2, 1]) == together[::-1]
    others = local.batch(prompts, [4, 5, 6])
    assert others != together  # 8 tokens from a random tiny model: three equal replies would be a broken stream
