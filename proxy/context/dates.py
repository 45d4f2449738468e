"""When the date matters: Keel tells the model today's date only where a turn speaks of time.

A date block costs every request some 28 tokens ("hi" would cost 34 instead of 6), so the
date is a context source sampled on the turns that need it: the first turn that speaks of time
(today, tomorrow, a weekday, a deadline, "how long ago"…, in the languages below, or a written
date) announces it, and once the model knows a date every later turn keeps it current, so a
change of local date is announced. Costs are asymmetric, so the word list errs wide: an extra
date is a few tokens, a missing one a wrong answer about time. A client that tells the model the
date itself (Claude Code: "Today's date is 2026-12-06."; Codex: `<current_date>2026-12-06`) needs
none from Keel: its own prompt already says today's date, written as year-month-day.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_WORDS = (
    # English
    r"today|tonight|tomorrow|yesterday|date|dates|dated|time|times|now|current|currently|latest|recent|recently|"
    r"week|weeks|weekend|month|months|year|years|day|days|hour|hours|minute|minutes|morning|evening|afternoon|"
    r"ago|since|until|till|deadline|due|overdue|schedule|scheduled|calendar|agenda|appointment|meeting|age|old|"
    r"birthday|anniversary|season|quarter|fiscal|monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    r"january|february|march|april|june|july|august|september|october|november|december|when|"
    # Spanish, Portuguese, French, Italian, German, Dutch
    r"hoy|mañana|ayer|fecha|hora|semana|mes|año|hoje|amanhã|ontem|data|semana|mês|ano|aujourd'hui|demain|hier|"
    r"semaine|mois|année|heure|oggi|domani|ieri|settimana|mese|anno|heute|morgen|gestern|datum|woche|monat|jahr|"
    r"uhr|vandaag|gisteren|maand|jaar|"
    # Russian, Turkish, Indonesian
    r"сегодня|завтра|вчера|дата|неделя|месяц|год|bugün|yarın|dün|tarih|hafta|yıl|hari ini|besok|kemarin|tanggal"
)
_TIME = re.compile(rf"(?<!\w)(?:{_WORDS})(?!\w)", re.IGNORECASE)
# Scripts without spaces between words: match the word anywhere.
_CJK = re.compile(r"今天|明天|昨天|日期|时间|時間|星期|今日|明日|昨日|日付|曜日|오늘|내일|어제|날짜|시간|"
                  r"اليوم|غدا|أمس|تاريخ|आज|कल|तारीख")
_WRITTEN = re.compile(r"\b\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}\b|\b\d{1,2}:\d{2}\b")


def speaks_of_time(text: str) -> bool:
    """Does this message need today's date to be answered well? (Reads at most 4,000 characters.)"""
    sample = text if len(text) <= 4000 else text[:2000] + "\n" + text[-2000:]
    return bool(_TIME.search(sample) or _CJK.search(sample) or _WRITTEN.search(sample))


def states_date(texts: Iterable[str], day: str) -> bool:
    """Does the client's own prompt say today's date (`day`, as YYYY-MM-DD) in any of its texts?"""
    return any(day in text for text in texts)
