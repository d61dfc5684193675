"""AutoResearchEnv end to end on real sandbox runs: the reward ladder, private/ isolation,
the outcome seam, gym ids, check_env, and Sync/AsyncVectorEnv multi-turn episodes."""

from __future__ import annotations

import json
import shutil

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import wmrl_envs  # noqa: F401  (registers the ids)
from wmrl_envs.autoresearch.env import AutoResearchEnv
from wmrl_envs.autoresearch.leaderboard import reference_pool
from wmrl_envs.autoresearch.tasks import get_task, list_catalog
from wmrl_envs.outcome import Outcome
from wmrl_envs.sandbox import Limits, default_executor


def _code(task_id: str, solution_id: str) -> str:
    return next(s.code for s in reference_pool(task_id) if s.solution_id == solution_id)


def _best(task_id: str) -> str:
    entries = json.loads((get_task(task_id).private_dir / "leaderboard.json").read_text())["entries"]
    return entries[0]["solution_id"]


def _reply(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


@pytest.fixture(scope="module")
def executor():
    return default_executor()


@pytest.mark.parametrize("task_id, trivial", [("penguins", "majority"), ("boston", "mean"), ("breast_cancer", "prior")])
def test_reward_ladder_on_real_runs(executor, task_id, trivial):
    env = AutoResearchEnv(task_id, executor=executor, max_turns=6)
    env.reset(seed=0)
    # strong: the pool's best reference solution
    _, r_strong, *_, info = env.step(_reply(_code(task_id, _best(task_id))))
    strong = info.get("outcome")
    assert strong.status == "valid" and strong.metrics["percentile"] >= 0.9 and strong.score >= 0.95
    # trivial baseline: valid but near the bottom
    *_, info = env.step(_reply(_code(task_id, trivial)))
    assert info.get("outcome").status == "valid" and info.get("outcome").metrics["percentile"] <= 0.3
    # broken script: syntax error, decided without running
    *_, info = env.step(_reply("import pandas as pd\nprint(pd.read_csv('data/train.csv'\n"))
    assert info.get("outcome").status == "syntax_error" and info.get("outcome").score == 0.0 and not info["graded"]
    # runtime error
    *_, info = env.step(_reply("import pandas as pd\ntrain = pd.read_csv('data/train.csv')\ntrain['no_such_column']\n"))
    assert info.get("outcome").status == "runtime_error" and info.get("outcome").score == 0.1
    assert "KeyError" in info.get("outcome").feedback
    # ran, but no submission
    *_, info = env.step(_reply("import pandas as pd\nprint(len(pd.read_csv('data/train.csv')))\n"))
    assert info.get("outcome").status == "no_submission" and info.get("outcome").score == 0.2
    # ran, invalid submission
    _, r_last, terminated, _, info = env.step(_reply("open('submission.csv', 'w').write('id,prediction\\n1,2\\n')\n"))
    assert info.get("outcome").status == "no_submission" and "expected exactly" in info.get("outcome").feedback
    assert terminated and info.get("trajectory_reward") == strong.score and r_strong == strong.score and r_last == 0.0
    assert [o.status for o in info["outcomes"]] == [
        "valid",
        "valid",
        "syntax_error",
        "runtime_error",
        "no_submission",
        "no_submission",
    ]


def test_private_answers_are_unreachable_from_a_solution(executor):
    task = get_task("titanic")
    probe = f"""
import json, os
found = []
candidates = ["../private/answers.csv", "../../private/answers.csv", "data/../private/answers.csv",
              "../private/leaderboard.json", {str(task.private_dir / "answers.csv")!r},
              {str(task.root / "private")!r}, "/proc/self/cwd/../private/answers.csv",
              "/proc/1/root" + {str(task.private_dir / "answers.csv")!r}]
for path in candidates:
    if os.path.exists(path):
        found.append(path)
# walk everything visible except the kernel's pseudo-filesystems and the read-only /usr
for top in sorted(set(os.listdir("/")) - {{"proc", "sys", "dev", "usr"}}):
    for dirpath, dirnames, filenames in os.walk("/" + top):
        found += [os.path.join(dirpath, f) for f in filenames if f in ("answers.csv", "leaderboard.json", "task.json")]
        found += [os.path.join(dirpath, d) for d in dirnames if d == "private"]
found += [k for k, v in os.environ.items() if "private" in v or "answers" in v]
print(json.dumps(found))
"""
    result = executor.run(probe, inputs=task.inputs(), outputs=("submission.csv",), limits=Limits(wall_seconds=60))
    assert result.status == "ok", result.stderr_tail
    assert json.loads(result.stdout_tail.strip().splitlines()[-1]) == []
    # and through the env, the pool's cheating script fails at run time (0.1), never scores
    env = AutoResearchEnv("titanic", executor=executor, max_turns=1)
    env.reset(seed=0)
    *_, info = env.step(_reply(_code("titanic", "broken_reads_private_answers")))
    assert info.get("outcome").status == "runtime_error" and "answers.csv" in info.get("outcome").feedback


def test_world_model_outcome_replaces_grading_without_running(executor, tmp_path):
    env = AutoResearchEnv("wine", executor=executor, max_turns=3)
    env.reset(seed=0, options={"group_id": 7})
    action = _reply("print('never runs')\n")
    request = env.grading_request(action)
    assert request.group_id == 7 and request.action == "print('never runs')\n"
    ctx = request.context
    assert ctx["task_id"] == "wine" and ctx["turn"] == 0 and ctx["history"] == []
    assert ctx["meta"]["n_classes"] == 3 and ctx["meta"]["metric"] == "log_loss" and "Data inventory" in ctx["overview"]
    assert "private" not in json.dumps(ctx)
    env.pending_outcome = Outcome("valid", 0.8, source="wm")
    _, reward, _, _, info = env.step(action)
    assert info.get("outcome").source == "wm" and reward == pytest.approx(0.8) and info["graded"]
    env.pending_outcome = None  # unknown: no reward, never 0-scored
    _, reward, _, _, info = env.step(action)
    assert info.get("outcome") is None and reward == 0.0
    env.pending_outcome = Outcome("valid", 0.9, source="wm")
    _, reward, terminated, _, info = env.step(action)
    assert reward == pytest.approx(0.1) and terminated
    assert info.get("trajectory_reward") == pytest.approx(0.9) and info["outcomes"][1] is None
    # context carries earlier feedback on later turns
    env.reset(seed=0)
    env.step("REQUEST_INFO: metric")
    assert "metric" in env.grading_request(action).context["history"][0]


def test_harness_failure_is_unknown_not_zero(executor, tmp_path):
    src = get_task("boston")
    root = tmp_path / "boston_copy"
    shutil.copytree(src.root, root)
    env = AutoResearchEnv(str(root), executor=executor, max_turns=1)
    env.reset(seed=0)
    (root / "private" / "answers.csv").unlink()  # the grader cannot score
    _, reward, _, _, info = env.step(
        _reply("import shutil\nshutil.copy('data/sample_submission.csv', 'submission.csv')\n")
    )
    assert info["graded"] and info.get("outcome") is None and reward == 0.0 and info.get("trajectory_reward") is None


def test_gym_ids_sampling_and_check_env():
    ids = {i for i in gym.registry if i.startswith("wmrl/AutoResearch")}
    assert ids >= {f"wmrl/AutoResearch-{t}-v0" for t in list_catalog()} | {"wmrl/AutoResearch-v0"}
    env = gym.make("wmrl/AutoResearch-v0", split="test")
    seen = {env.reset(seed=s)[1]["task_id"] for s in range(30)}
    assert seen <= set(list_catalog("test")) and len(seen) >= 4
    with pytest.raises(ValueError, match="'wage' is in the 'train' split"):  # a held-out env hands out no training task
        env.reset(options={"task": "wage", "group_id": "g1"})
    with pytest.warns(UserWarning, match="using train-split task 'wage'"):
        _, info = env.reset(options={"task": "wage", "group_id": "g1", "any_split": True})
    assert info["task_id"] == "wage" and info["group_id"] == "g1" and info["metric"] == "rmse"
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"tsak": "wage"})
    # check_env samples random text: every such action is malformed and costs nothing
    check_env(gym.make("wmrl/AutoResearch-titanic-v0").unwrapped, skip_render_check=True)
    check_env(AutoResearchEnv(split="test"), skip_render_check=True)


def test_request_info_topics_reveal_no_hidden_labels():
    env = AutoResearchEnv("chile", max_turns=12)
    env.reset(seed=0)
    answers = get_task("chile").read_answers()
    for topic in (
        "overview",
        "data_head",
        "column_stats",
        "target_distribution",
        "metric",
        "sample_submission",
        "leaderboard",
        "help",
        "bogus",
    ):
        obs, reward, _, _, info = env.step(f"REQUEST_INFO: {topic}")
        assert info["action_type"] == "request_info" and reward == 0.0 and not info["graded"]
        assert len(obs) <= env.config.max_obs_chars
    assert "Unknown topic 'bogus'" in obs
    # the target distribution is computed from train.csv only, never from the held-out answers
    env.reset(seed=0)
    obs, *_ = env.step("REQUEST_INFO: target_distribution")
    counts = [int(line.split()[-1]) for line in obs.splitlines()[2:] if line.split() and line.split()[-1].isdigit()]
    assert sum(counts) == len(get_task("chile").read_train()) != len(get_task("chile").read_train()) + len(answers)


def test_sync_vector_env_cheap_turns():
    envs = gym.vector.SyncVectorEnv(
        [lambda t=t: gym.make(f"wmrl/AutoResearch-{t}-v0", max_turns=2) for t in ("wine", "hmda")]
    )
    obs, infos = envs.reset(seed=0)
    assert list(infos["task_id"]) == ["wine", "hmda"] and all("Data inventory" in o for o in obs)
    obs, rew, term, trunc, infos = envs.step(["REQUEST_INFO: metric", "no code here"])
    assert list(infos["action_type"]) == ["request_info", "malformed"] and not term.any()
    obs, rew, term, trunc, infos = envs.step(["bad", "bad"])
    assert term.all() and list(infos["trajectory_reward"]) == [0.0, 0.0]
    envs.close()


def test_async_vector_env_multi_turn_episode_two_workers():
    tasks = ("penguins", "boston")
    trivial = {"penguins": "majority", "boston": "mean"}
    envs = gym.vector.AsyncVectorEnv(
        [lambda t=t: gym.make(f"wmrl/AutoResearch-{t}-v0", max_turns=3) for t in tasks], shared_memory=False
    )
    try:
        obs, infos = envs.reset(seed=0, options={"group_id": 3})
        assert list(infos["task_id"]) == list(tasks) and list(infos["group_id"]) == [3, 3]
        steps = [
            ["REQUEST_INFO: data_head", "REQUEST_INFO: target_distribution"],
            [_reply(_code(t, trivial[t])) for t in tasks],
            [_reply(_code(t, _best(t))) for t in tasks],
        ]
        total = np.zeros(2)
        for k, actions in enumerate(steps):
            obs, rew, term, trunc, infos = envs.step(actions)
            total += rew
            assert list(infos["turn"]) == [k, k] and not trunc.any()
        assert term.all()
        assert list(infos["action_type"]) == ["execute", "execute"] and all(infos["graded"])
        for i in range(2):
            statuses = [o.status for o in infos["outcomes"][i]]
            assert statuses == ["valid", "valid"]
            assert infos["trajectory_reward"][i] == pytest.approx(total[i]) and total[i] >= 0.95
            assert "[turn 3/3: execute, valid]" in obs[i]
    finally:
        envs.close()
