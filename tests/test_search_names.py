"""A search whose words name a tool loads that tool (issue 21, finding 8): the model searched for
"backlinks summary" and got `backlinks_bulk_pages_summary` loaded, the exact-named
`backlinks_summary` only as a second-place brief, so its call never came."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, tenant

from proxy.standin.script import hidden_call
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.ranking import LexicalRanker
from proxy.tools.search import answer_search

# An SEO toolkit's backlink tools, worded so that the long names' descriptions say "backlinks" and
# "summary" more often than the plain summary's does (as in the real catalog the finding used).
TOOLS = {
    "backlinks_summary": "Overview of the backlink profile of one domain, subdomain or page.",
    "backlinks_bulk_pages_summary": "Backlinks summary for a bulk of pages: a summary of the backlinks of up to "
                                    "1000 pages, with summary backlinks counts for each.",
    "backlinks_domain_pages_summary": "Backlinks summary per page of a domain: backlinks and referring domains.",
    "backlinks_timeseries_summary": "Backlinks summary over time: how the backlinks summary changed per day.",
    "backlinks_timeseries_new_lost_summary": "New and lost backlinks summary over time, per day.",
    "backlinks_anchors": "Anchor texts of the backlinks pointing to a target.",
    "backlinks_referring_domains": "Domains that link to a target, with their ranks.",
    "keywords_search_volume": "Monthly search volume of keywords in a location and language.",
    "keywords_for_site": "Keywords a site ranks for, with positions and traffic.",
    "serp_organic_live": "Live organic search results for a keyword.",
    "domain_rank_overview": "Ranking and traffic overview of a domain.",
    "on_page_instant_pages": "Crawl one page and report its on-page checks.",
    "content_analysis_search": "Find content citations of a keyword across the web.",
}


def catalog_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": name, "description": text, "parameters": {
        "type": "object", "properties": {"target": {"type": "string", "description": "a domain, subdomain or URL"},
                                         "limit": {"type": "integer", "description": "how many rows to return"}},
        "required": ["target"]}}} for name, text in TOOLS.items()]


def test_a_search_in_a_tools_words_loads_it(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Nothing ranked ships (every tool one search away); the model searches with the user's words;
    the tool those words name is the one loaded, so the client gets its call."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "select": {"enabled": False}})))
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    text = "get the backlinks summary for example.com " + hidden_call("backlinks_summary", '{"target": "example.com"}',
                                                                       search_by_words=True)
    reply = client.chat.completions.create(model="m", tools=catalog_tools(),  # type: ignore[arg-type]
                                           messages=[{"role": "user", "content": text}])
    calls = reply.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["backlinks_summary"], reply.choices[0].message.content


@pytest.mark.parametrize("query, named", [
    ("backlinks summary", ("backlinks_summary",)),
    ("BacklinksSummary of example.com", ("backlinks_summary",)),
    ("the backlinks bulk pages summary and the keywords for site", ("backlinks_bulk_pages_summary",
                                                                     "keywords_for_site")),
    ("a summary of backlinks", ()),  # words out of order name nothing: the best match alone is found
])
async def test_named_by_words(query: str, named: tuple[str, ...]) -> None:
    """Names said in words, in order, whole (a longer name's words win over a shorter name inside
    them), are all loaded, with the best match beside them (words may say a shorter name than the
    tool meant); a name written as such is loaded alone, as before."""
    catalog = CatalogCache(TokenCounter()).get(catalog_tools())
    assert catalog is not None
    answer = await answer_search(orjson.dumps({"query": query}).decode(), catalog, list(TOOLS), 5, LexicalRanker())
    assert answer.found[: len(named)] == named and len(answer.found) == len(named) + 1
    exact = await answer_search('{"query": "backlinks_summary please"}', catalog, list(TOOLS), 5, LexicalRanker())
    assert exact.found == ("backlinks_summary",)


async def test_words_load_the_best_match_beside() -> None:
    """"the backlinks summary over time" says `backlinks_summary` and means the time series: both load."""
    catalog = CatalogCache(TokenCounter()).get(catalog_tools())
    assert catalog is not None
    answer = await answer_search('{"query": "the backlinks summary over time"}', catalog, list(TOOLS), 5,
                                 LexicalRanker())
    assert answer.found == ("backlinks_summary", "backlinks_timeseries_summary")
