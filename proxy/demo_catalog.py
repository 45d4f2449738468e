"""The demo's tool catalog: the real MCP catalogs in ../shared/data when present, else one Keel writes.

The generated one is shaped like an agent's MCP servers: eight services, their tools named the way
such servers name them, each with a description and a JSON schema of a realistic size (~1.3 kB),
so the tool block costs about what a real one does (~26k tokens for its 118 tools).
"""

from __future__ import annotations

import json
from pathlib import Path

from proxy.jsontext import JsonObject

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "catalogs" / "agent_8servers.json"

_SERVICES: dict[str, tuple[str, list[str]]] = {
    "": ("GitHub", ["issue_write", "issue_read", "list_issues", "search_issues", "add_issue_comment",
                    "create_pull_request", "list_pull_requests", "merge_pull_request", "pull_request_read",
                    "update_pull_request", "create_branch", "list_branches", "list_commits", "get_commit",
                    "get_file_contents", "create_or_update_file", "push_files", "search_code", "search_repositories",
                    "create_repository", "fork_repository", "list_releases", "get_latest_release", "list_tags",
                    "actions_list", "actions_run_trigger", "get_job_logs", "list_notifications", "get_me",
                    "list_dependabot_alerts"]),
    "slack_": ("Slack", ["list_channels", "post_message", "reply_to_thread", "add_reaction", "get_channel_history",
                         "get_thread_replies", "get_users", "get_user_profile", "create_channel", "archive_channel",
                         "set_topic", "upload_file", "search_messages", "pin_message", "schedule_message"]),
    "maps_": ("Google Maps", ["geocode", "reverse_geocode", "search_places", "place_details", "distance_matrix",
                              "elevation", "directions", "timezone", "nearby_search", "static_map"]),
    "fs_": ("filesystem", ["read_file", "read_multiple_files", "write_file", "edit_file", "create_directory",
                           "list_directory", "directory_tree", "move_file", "search_files", "get_file_info"]),
    "jira_": ("Jira", ["create_issue", "get_issue", "update_issue", "transition_issue", "add_comment", "search",
                       "list_projects", "get_project", "assign_issue", "link_issues", "add_worklog", "get_sprint",
                       "list_sprints", "create_sprint", "get_board"]),
    "stripe_": ("Stripe", ["create_customer", "list_customers", "create_invoice", "finalize_invoice",
                           "list_invoices", "create_refund", "list_payment_intents", "create_price", "create_product",
                           "list_subscriptions", "cancel_subscription", "update_subscription", "retrieve_balance",
                           "create_coupon", "list_disputes"]),
    "sentry_": ("Sentry", ["list_issues", "get_issue_details", "resolve_issue", "list_projects", "list_releases",
                           "get_event", "search_events", "list_alerts", "create_alert_rule", "get_performance"]),
    "notion_": ("Notion", ["search", "get_page", "create_page", "update_page", "append_block", "query_database",
                           "create_database", "get_comments", "add_comment", "list_users"]),
}
_EXTRA = [("get_current_time", "Get the current time in an IANA timezone", {"timezone": "IANA timezone name"}),
          ("convert_time", "Convert a time between timezones", {"time": "HH:MM", "source_timezone": "IANA zone",
                                                                 "target_timezone": "IANA zone"}),
          ("fetch", "Fetch a URL and return its content as markdown", {"url": "the URL"})]


def _schema(service: str, verb: str, words: list[str]) -> JsonObject:
    thing = " ".join(words[1:]) or words[0]
    props: JsonObject = {
        "owner": {"type": "string", "description": f"The {service} account or organisation that owns the {thing}."},
        "id": {"type": "string", "description": f"Identifier of the {thing}; see the list tool for the values."},
        "query": {"type": "string", "description": f"Free-text filter applied to {thing} titles and bodies."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "Results per page (default 30)."},
        "cursor": {"type": "string", "description": "Pagination cursor returned by a previous call."},
        "fields": {"type": "array", "items": {"type": "string"}, "description": f"Fields of the {thing} to return."},
        "state": {"type": "string", "enum": ["open", "closed", "all"], "description": "Filter by state."},
    }
    return {"type": "object", "properties": props, "required": ["owner"] if verb != "get" else ["id"]}


def generated() -> list[JsonObject]:
    tools = []
    for prefix, (service, names) in _SERVICES.items():
        for name in names:
            words = name.split("_")
            text = (f"{service}: {' '.join(words).capitalize()}. Use this to {' '.join(words)} in {service} on the "
                    f"user's behalf; it returns the affected objects as JSON with their ids, URLs and timestamps. "
                    f"Requires the {service} connection to be authorised for the workspace.")
            tools.append({"type": "function", "function": {"name": prefix + name, "description": text,
                                                           "parameters": _schema(service, words[0], words)}})
    for name, text, params in _EXTRA:
        props = {k: {"type": "string", "description": v} for k, v in params.items()}
        tools.append({"type": "function", "function": {"name": name, "description": text, "parameters": {
            "type": "object", "properties": props, "required": list(params)}}})
    return tools


def demo_catalog() -> tuple[list[JsonObject], str]:
    """The tools, and where they came from."""
    if REAL.is_file():
        data = json.loads(REAL.read_text())
        return list(data["tools"]), f"{len(data['tools'])} tools of 8 real MCP servers ({REAL.name})"
    tools = generated()
    return tools, f"{len(tools)} generated tools of {len(_SERVICES) + 1} MCP-style servers"
