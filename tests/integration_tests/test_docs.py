"""The interactive API docs work without internet: every file they load comes from the service."""

from __future__ import annotations

import re

import pytest

from .conftest import StartService

#: What each asset of the docs pages must be served as.
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_every_asset_from_the_service(
    start_service: StartService, page: str
) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.get(page)
    assert response.status_code == 200
    html = response.text
    assert "://" not in html, re.findall(r"\S*://\S*", html)  # no CDN, no web font

    assets = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    assert any(url.endswith(".js") for url in assets), assets
    for url in assets:
        extension = url[url.rfind(".") :]
        asset = await service.client.get(url)
        assert asset.status_code == 200, url
        assert asset.headers["content-type"].startswith(CONTENT_TYPES[extension]), url
        assert len(asset.content) > 1000, url  # the file itself, not an error page
