"""The conversation is the query: the tool planner reads the turns before the newest message."""

from __future__ import annotations

import json
from typing import Any

from conftest import keel_config, tenant, tool

from proxy.metrics import Metrics
from proxy.testing import FakeRanker
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache, build_catalog
from proxy.tools.gate import explains, follow_up, needs_tool_probability
from proxy.tools.planner import ToolPlan, ToolPlanner
from proxy.tools.ranking import LexicalRanker
from proxy.tools.window import CALL_WEIGHT, USER_WEIGHT, Window, with_context
from proxy.turn import Turn

PARAMS = {f"p{i}": "string" for i in range(12)}  # every schema over schema_chars: nothing pinned by size
TOOLS = [
    tool("kubectl_get", "Get Kubernetes resources (pods, deployments) in a namespace.", **PARAMS),
    tool("kubectl_logs", "Print the logs of a container in a pod.", **PARAMS),
    tool("kubectl_scale", "Scale a deployment to a number of replicas.", **PARAMS),
    tool("cloudwatch_log_groups", "Describe CloudWatch log groups of an AWS account.", **PARAMS),
    tool("jira_get_issue", "Get a Jira issue by key.", **PARAMS),
    tool("jira_transition_issue", "Move a Jira issue to another status.", **PARAMS),
    tool("slack_post_message", "Post a message to a Slack channel.", **PARAMS),
]


def exchange(ask: str, name: str, arguments: dict[str, Any], result: str, answer: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": ask},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "assistant", "content": answer}]


PODS = exchange("list the pods in prod", "kubectl_get", {"resource": "pods", "namespace": "prod"},
                "api-7f9c 0/1 CrashLoopBackOff", "api-7f9c is crash-looping.")


async def shipped(messages: list[dict[str, Any]]) -> ToolPlan:
    config = keel_config(tenant("http://up/v1", tools={"enabled": True, "stability": "per_turn", "defer": {"min_tools": 0}}))
    turn = Turn(config.tenants[0], b"", {"model": "m", "tools": TOOLS, "messages": messages}, {}, "rid")
    planner = ToolPlanner(CatalogCache(TokenCounter()), lambda cfg: LexicalRanker(), Metrics(), lambda plan, r: plan)
    planned = await planner.plan(turn)
    assert isinstance(planned.responder, ToolPlan)
    return planned.responder


def test_window_reads_calls_replies_and_the_previous_message_by_recency() -> None:
    older = exchange("get ENG-1 from jira", "jira_get_issue", {"key": "ENG-1"}, "ENG-1 Login bug", "ENG-1 is a login bug.")
    window = Window.of([*older, *PODS, {"role": "user", "content": "what is it logging?"}], found=["slack_post_message"])
    assert window.newest == "what is it logging?" and window.acted
    weights = dict(window.context)
    assert weights["list the pods in prod"] == USER_WEIGHT  # the previous exchange: full weight
    assert weights['kubectl get {"resource": "pods", "namespace": "prod"}'] == CALL_WEIGHT
    assert weights["get ENG-1 from jira"] < USER_WEIGHT  # older exchanges count less
    assert "slack post message" in weights  # what earlier searches found
    assert not any("CrashLoopBackOff" in text for text in weights)  # tool results are the world's data: not read
    assert Window.of([{"role": "user", "content": "hi"}]) == Window("hi")


async def test_a_follow_up_ships_the_tool_the_turns_before_point_to() -> None:
    """"what is it logging?" after listing pods: the pod's logs, not CloudWatch's log groups."""
    alone = await shipped([{"role": "user", "content": "what is it logging?"}])
    assert "kubectl_logs" not in alone.surfaced[:1]
    result = await shipped([*PODS, {"role": "user", "content": "what is it logging?"}])
    assert "kubectl_logs" in result.surfaced and result.outcome == "ranked"
    scaled = await shipped([*PODS, {"role": "user", "content": "take the deployment down to 2"}])
    assert "kubectl_scale" in scaled.surfaced


async def test_small_talk_and_concept_questions_after_a_tool_turn_ship_nothing_new() -> None:
    for text in ("thanks, that helps!", "what does CrashLoopBackOff mean in general?"):
        result = await shipped([*PODS, {"role": "user", "content": text}])
        assert set(result.surfaced) == {"kubectl_get"}, text  # only the tool the history called


def test_follow_up_needs_a_turn_that_acted() -> None:
    assert follow_up("and close it", acted=True)
    assert not follow_up("and close it", acted=False)
    assert not follow_up("thanks!", acted=True)
    assert not follow_up("what is a namespace, in simple terms?", acted=True)


def test_concept_questions_are_answered_without_tools_unless_they_name_something_to_act_on() -> None:
    assert explains("what is a readiness probe for?")
    assert explains("what's the difference between a tag and a release?")
    assert explains("wie funktioniert ein Helm-Chart?")
    assert not explains("what is the status of ENG-12?")  # an id: act
    assert not explains("what is it doing?")
    assert needs_tool_probability(20.0, "what is a readiness probe for?") < 0.5


async def test_context_adds_to_any_backend_on_its_own_scale() -> None:
    """A non-lexical ranker's scores get the context scaled to them, never BM25's raw units."""
    catalog = build_catalog("k", TOOLS)
    ranker = FakeRanker(best=["cloudwatch_log_groups", "kubectl_logs"], scores=[1.0, 0.9])
    ranking = await ranker.rank("logs", catalog, range(len(TOOLS)), 3)
    window = Window.of([*PODS, {"role": "user", "content": "logs"}])
    candidates = [i for i, e in enumerate(catalog.entries) if e.name != "kubectl_get"]  # called: pinned, not ranked
    fused = with_context(ranking, window, catalog, candidates, 3, follow_up=True, lexical=False)
    assert catalog.entries[fused.order[0]].name == "kubectl_logs"
    assert max(fused.scores) <= 1.0 + 3.0  # the ranker's top plus the follow-up's boost at most


GIT = [tool("git_add", "Stage files.", **PARAMS), tool("git_commit", "Record staged changes.", **PARAMS),
       tool("git_status", "Show the working tree status.", **PARAMS),
       tool("jira_transition_issue", "Move an issue; get the transition id with jira_get_transitions.", **PARAMS),
       tool("jira_get_transitions", "List the transitions an issue can take.", **PARAMS)]


async def test_the_unsaid_step_ships_once_traffic_has_shown_it() -> None:
    """Models of this scope called git_add right before git_commit (twice): "commit my changes"
    now ships git_add too; another scope, or one pair seen once, ships no such guess."""
    from proxy.stores.sqlite import SqliteStore
    from proxy.tools.learned import SEQUENCE_SEEN, LearnedPhrases, scope_of

    config = keel_config(tenant("http://up/v1", tools={"enabled": True, "stability": "per_turn",
                                                        "defer": {"min_tools": 0}}))
    learned = LearnedPhrases(SqliteStore(":memory:"))

    async def ship(user: str) -> tuple[str, ...]:
        turn = Turn(config.tenants[0], b"", {"model": "m", "tools": GIT, "user": user,
                                             "messages": [{"role": "user", "content": "commit my changes"}]}, {}, "r")
        planner = ToolPlanner(CatalogCache(TokenCounter()), lambda cfg: FakeRanker(best=["git_commit"]), Metrics(),
                              lambda plan, r: plan, learned=learned)
        planned = await planner.plan(turn)
        assert isinstance(planned.responder, ToolPlan)
        return planned.responder.surfaced

    probe = Turn(config.tenants[0], b"", {"model": "m", "user": "ann", "messages": []}, {}, "r")
    scope = scope_of(config.tenants[0].id, probe.owner)
    await learned.learn_sequence(scope, "git_add", "git_commit")
    assert await ship("ann") == ("git_commit",)  # seen once: not yet
    for _ in range(SEQUENCE_SEEN):
        await learned.learn_sequence(scope, "git_add", "git_commit")
    learned._sequences.clear()  # read again now, not a minute later
    assert await ship("ann") == ("git_add", "git_commit")
    assert await ship("bob") == ("git_commit",)  # another end user's traffic teaches nothing here


def test_a_tools_description_names_its_companions_of_the_same_server() -> None:
    catalog = build_catalog("g", GIT)
    assert catalog.companions() == {"jira_transition_issue": ("jira_get_transitions",)}


def test_the_lexical_index_reads_arabic_persian_and_indic_scripts() -> None:
    """Arabic letters unified and the article taken off, Persian's ZWNJ split, Indic words kept whole
    with their vowel signs: each meets the glossary's English words without a download."""
    from proxy.tools.text import query_terms

    assert "backlink" in query_terms("اعرض لي الروابط الخلفية لموقع example.com")
    assert "log" in query_terms("لاگ‌های پاد api را نشان بده")
    assert {"custom", "creat"} <= set(query_terms("स्ट्राइप में नया ग्राहक बनाओ"))
    assert "ग्राहक" in query_terms("नया ग्राहक")  # one word, not "ग" + "र" + "हक"
    assert "time" in query_terms("ตอนนี้กี่โมงที่กรุงเทพ")
