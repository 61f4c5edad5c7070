"""A process's namespace and id as one percent-encoded path segment (`api.segments`)."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from dataloader.api.segments import segment, sent_path


@pytest.mark.parametrize("text", ["report/call", "events", "50% off?#x", "é/", " a "])
def test_any_text_is_one_segment_and_back(text: str) -> None:
    encoded = segment(text)
    assert "/" not in encoded
    assert unquote(encoded) == text


def test_the_path_as_sent_keeps_its_encoded_slashes() -> None:
    scope = {"raw_path": b"/api/v1/processes/o/report%2Fcall/call", "path": "ignored"}
    assert sent_path(scope) == "/api/v1/processes/o/report%2Fcall/call"


def test_bytes_beyond_ascii_are_encoded_and_a_query_is_dropped() -> None:
    assert sent_path({"raw_path": "/p/é?x=1".encode()}) == "/p/%C3%A9"


def test_the_root_paths_segments_are_dropped() -> None:
    scope = {"raw_path": b"/my%20base/p/a%2Fb", "root_path": "/my base", "path": "/my base/p/a/b"}
    assert sent_path(scope) == "/p/a%2Fb"


def test_no_raw_path_is_none() -> None:
    assert sent_path({"path": "/p/a"}) is None
