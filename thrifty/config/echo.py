"""What user input may look like and how it is echoed back: size and depth limits on plain data (a YAML alias bomb
or a thousand nested lists is refused before anything walks it), capped echoes of values in messages, and URLs with
their secrets (userinfo, path, query) hidden in logs."""

from __future__ import annotations

import re
from typing import Any

from thrifty.config.base import MAX_ECHO_CHARS, ConfigError, cut, shown

__all__ = ["MAX_CONFIG_BYTES", "MAX_DEPTH", "MAX_ECHO_CHARS", "MAX_VALUES", "check_plain", "cut", "redact_urls", "shorten_words",
           "shown"]

MAX_DEPTH = 32  # a RunConfig nests 3 deep; recipe options a few more
MAX_VALUES = 100_000  # every value counted as often as it is reached: YAML aliases count once per use
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KB; anything past 1 MiB is not one


def check_plain(data: Any, what: str) -> Any:
    """``data`` (parsed YAML or JSON) unchanged, or a ConfigError when it nests deeper than MAX_DEPTH or holds more
    than MAX_VALUES values counted as they would be copied (aliases once per use). The walk stops at the limit, so an
    alias bomb costs MAX_VALUES steps, never its expansion."""
    budget = [MAX_VALUES]
    todo: list[tuple[Any, int]] = [(data, 0)]
    while todo:
        node, depth = todo.pop()
        budget[0] -= 1
        if budget[0] < 0:
            raise ConfigError(f"{what} holds more than {MAX_VALUES:,} values (counting each use of a YAML alias); "
                              "a config is a few dozen settings: remove the repeated or generated part")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels; a config is a few levels of settings: "
                              "remove the nested part")
        if isinstance(node, dict):
            todo.extend((v, depth + 1) for v in node.values())
            todo.extend((k, depth + 1) for k in node if not isinstance(k, (str, int, float, bool)))
        elif isinstance(node, (list, tuple)):
            todo.extend((v, depth + 1) for v in node)
    return data


_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_ECHO_CHARS * 2))


def shorten_words(text: str) -> str:
    """``text`` with every run of non-space characters longer than 2 x MAX_ECHO_CHARS cut, saying how long it was: an
    error message that quotes a 100 KB argument stays a line, while a long message of many words keeps them all."""
    return _LONG_WORD.sub(lambda m: cut(m.group(0)), text)


_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#'\"<>@]*@)?([^\s/?#'\"<>]*)([^\s'\"<>]*)")


def redact_urls(text: str) -> str:
    """Every URL in ``text`` cut to its scheme and host: webhook URLs carry their token in the path
    (hooks.slack.com/services/T/B/TOKEN), the query (?token=) or the userinfo, none of which may reach a log."""
    def cut(m: re.Match) -> str:
        scheme, _userinfo, host, rest = m.groups()
        return f"{scheme}{'***@' if _userinfo else ''}{host}{'/***' if rest.strip('/') else ''}"

    return _URL.sub(cut, text)
