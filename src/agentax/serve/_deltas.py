"""`ContentDeltas`: the text of a streamed reply that is final, as its tokens arrive.

A streamed reply sends `delta.content` pieces that concatenate to the reply's `content`, so a
piece may leave only once no later token can change it. What is held back:

* an incomplete UTF-8 character at the end (the decoded text ends in U+FFFD);
* a stop string (`stop`) and everything after it, and any suffix that could still grow into
  one (OpenAI leaves the stop sequence out of the content);
* with tools in the request, text that could be a tool call: from the first tool-call tag
  (or a suffix that could grow into one) to the end, and trailing whitespace (a reply with a
  call has its content stripped). A reply that begins with whitespace, or a tool format
  without known tags (llama3's calls are bare JSON), is held whole; the calls themselves are
  sent as `tool_calls` deltas once the finished reply is parsed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["ContentDeltas", "delivered_content"]

CALL_TAGS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen": ("<tool_call>", "</tool_call>"),
}
"""Tool formats whose calls start with a tag: text before the tag streams as content."""


def _growing_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class ContentDeltas:
    """Feeds a reply's tokens in; gives back the new content that can no longer change.

    Args:
      decode: the reply text of generated ids (`Session._decode`: a final eos dropped).
      stop: the request's stop strings.
      tool_format: the endpoint's tool-call format, or None when the request has no tools.
    """

    def __init__(self, decode: Callable[[np.ndarray], str], stop: Sequence[str] = (),
                 tool_format: str | None = None) -> None:
        self._decode, self._stop = decode, tuple(stop)
        self._tags = CALL_TAGS.get(tool_format, ()) if tool_format is not None else ()
        self._hold_all = tool_format is not None and tool_format not in CALL_TAGS
        self._ids: list[int] = []
        self.sent = ""
        """The content given out so far (the concatenated deltas)."""

    def feed(self, token_ids: Sequence[int] | np.ndarray) -> str:
        """Adds sampled ids; returns the content delta now final ("" when none)."""
        self._ids.extend(int(i) for i in np.asarray(token_ids).reshape(-1))
        safe = self._final_prefix(self._decode(np.asarray(self._ids, np.int32)))
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""  # nothing new (or the decoder re-spelled earlier text: wait for the end)
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def _final_prefix(self, text: str) -> str:
        if self._hold_all:  # tools of a format without tags: the whole reply is held
            return ""
        text = text.rstrip("\ufffd")
        cut = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if cut:
            text = text[: min(cut)]
        else:
            text = text[: len(text) - _growing_suffix(text, self._stop)]
        if self._tags:
            if text[:1].isspace():
                return ""
            cut = [i for i in (text.find(t) for t in self._tags) if i >= 0]
            text = text[: min(cut)] if cut else text[: len(text) - _growing_suffix(text, self._tags)]
            text = text.rstrip()
        return text


def delivered_content(sent: str, content: str | None) -> str | None:
    """The content a client that received `sent` ends with once the rest is sent.

    `content` is the reply's content as a non-streamed call returns it; the deltas sent are a
    prefix of it by construction. Were they not (a decoder that re-spells a prefix), the rest
    of `content` past the length sent is appended: the session records what the client holds,
    so its next request still continues the conversation.
    """
    if not sent:
        return content
    return sent + (content or "")[len(sent):]
