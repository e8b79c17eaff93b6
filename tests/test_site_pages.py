"""The site's pages as one site: the catalogue and records pages in its style and with numbers for people, its 403
page for a researcher on an admin-only page, the branded Django admin, and no link anywhere that leads nowhere."""

from __future__ import annotations

import html
import re
from collections import deque
from urllib.parse import urljoin, urlsplit

import pytest
from django.urls import reverse

from fc2.models import Job
from fc2.services import artifacts
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests.conftest import make_job

LINK = re.compile(r"<a\s[^>]*?href=\"([^\"]*)\"", re.IGNORECASE)
# Pages of one shape (the same path but for object ids, any query string: sort, filter and page links, one job or
# another) are visited only a few times: the first ones already show every kind of link the shape has.
VISITS_PER_SHAPE = 3


@pytest.fixture
def catalogue(db):
    return load_catalog("aws-us-east-1")


@pytest.fixture
def records(db):
    common = {"workload": "anwar-resnet:cifar10", "instance_type": "c5.xlarge", "batch_size": 64}
    return [
        PerformanceRecord.objects.create(**common, workers=4, latency_ms=0.5, epoch_time_s=42.25, bandwidth_mbps=812.4),
        PerformanceRecord.objects.create(**common, workers=8, latency_ms=10.0, epoch_time_s=None),
    ]


@pytest.fixture
def site(alice, bob, bundle, digits, catalogue, records):
    """A little of everything a page can link to: alice's ended job with an artifact, a queued one, bob's job."""
    ended = make_job(alice, bundle, digits)
    Job.objects.filter(pk=ended.pk).update(state=Job.State.SUCCEEDED)
    artifacts.store_artifact(ended, "logs/chief-0.log", b"epoch 1 done\n")
    make_job(alice, bundle, digits)
    make_job(bob, bundle, digits)


# --- the catalogue and records pages ---


def test_catalogue_uses_the_sites_controls_and_formats_prices_and_capacities(client, alice, catalogue):
    client.force_login(alice)

    page = client.get(reverse("recommender-catalogs"), {"catalog": "aws-us-east-1", "q": "c5n.9xlarge"}).content
    page = page.decode()

    assert '<form method="get" class="card filterbar"' in page and '<button type="submit" class="btn">' in page
    row = re.search(r"<tr><td><code>c5n\.9xlarge</code>.*?</tr>", page, re.S).group(0)
    type_ = catalogue.types.get(name="c5n.9xlarge")
    assert f"${type_.hourly_price.normalize():f}/h" in row
    assert f"{type_.network_mbps / 1000:g} Gbps" in row and str(type_.network_mbps) not in row
    assert f"{type_.memory_gib:g} GiB" in row


def test_catalogue_pages_keep_the_filters(client, alice, catalogue):
    client.force_login(alice)

    page = client.get(reverse("recommender-catalogs"), {"catalog": "aws-us-east-1", "gpu": "1"}).content.decode()

    if "page 1 of" in page:
        assert 'href="?catalog=aws-us-east-1&amp;gpu=1&amp;page=2"' in page
    assert "GPU types only</option>" in page


def test_records_use_the_sites_controls_and_units(client, alice, records):
    client.force_login(alice)

    page = client.get(reverse("recommender-records"), {"workload": "anwar-resnet:cifar10"}).content.decode()

    assert (
        '<form method="get" class="card filterbar"' in page
        and '<button type="submit" class="btn">Show</button>' in page
    )
    assert "42.2 s" in page or "42.3 s" in page  # floatformat rounds half to even
    assert "812" in page and "812.4" not in page  # a rate in the column's Mbps, with sensible precision
    assert '<span class="badge failed">failed</span>' in page


# --- 403 and the admin ---


@pytest.mark.parametrize("url", ["/dashboard/", "/admin/", "/admin/fc2/job/"])
def test_a_researcher_on_an_admin_page_gets_the_sites_403(client, alice, url):
    client.force_login(alice)

    response = client.get(url, follow=True)

    assert response.status_code == 403
    assert "403.html" in [t.name for t in response.templates]
    page = response.content.decode()
    assert '<a class="brand" href="/">FC² platform</a>' in page  # the site's own frame
    assert "Not allowed" in page and f'href="{reverse("home")}"' in page


def test_anonymous_on_the_admin_is_asked_to_log_in(client, db):
    response = client.get("/admin/", follow=True)

    assert response.status_code == 200
    assert response.redirect_chain[-1][0].startswith("/admin/login/")


def test_the_admin_is_branded_and_links_back_to_the_site(admin_client):
    page = admin_client.get("/admin/").content.decode()

    assert "<title>Site administration | FC² platform admin</title>" in page
    assert '<a href="/admin/">FC² platform admin</a>' in page
    assert '<a href="/">View site</a>' in page


# --- no link leads nowhere ---


def crawl(client, start: str = "/") -> dict[str, int]:
    """Every page reachable from `start` by <a href> inside the site -> its status (redirects followed)."""
    seen: dict[str, int] = {}
    visits: dict[str, int] = {}
    queue = deque([(start, "")])
    while queue:
        url, found_on = queue.popleft()
        shape = re.sub(r"/\d+/", "/N/", urlsplit(url).path)
        if url in seen or visits.get(shape, 0) >= VISITS_PER_SHAPE:
            continue
        visits[shape] = visits.get(shape, 0) + 1
        response = client.get(url, follow=True)
        seen[url] = response.status_code
        assert response.status_code == 200, f"{url} (linked from {found_on or 'the start'}): {response.status_code}"
        if "text/html" not in response.get("Content-Type", ""):
            b"".join(getattr(response, "streaming_content", []))  # a download: read to the end, which closes its file
            continue
        for href in LINK.findall(response.content.decode()):
            target = urlsplit(urljoin(url, html.unescape(href)))
            if target.scheme in ("http", "https") and target.netloc not in ("", "testserver"):
                continue  # another site
            if target.scheme not in ("", "http", "https"):
                continue  # mailto: and the like
            queue.append((target.path + (f"?{target.query}" if target.query else ""), url))
    return seen


def test_no_page_links_to_nothing_for_a_researcher(client, alice, site):
    client.force_login(alice)

    pages = crawl(client)

    paths = {urlsplit(url).path for url in pages}
    assert {"/", "/jobs/", "/recommender/catalogs/", "/recommender/records/"} <= paths
    assert any(path.startswith("/jobs/") and "/artifacts/" in path for path in paths)


def test_no_page_links_to_nothing_for_an_admin(admin_client, site):
    pages = crawl(admin_client)

    paths = {urlsplit(url).path for url in pages}
    assert {"/", "/dashboard/", "/admin/", "/admin/fc2/job/"} <= paths
    for change_page in (r"/admin/fc2/codebundle/\d+/change/", r"/admin/fc2/artifact/\d+/change/"):
        assert any(re.fullmatch(change_page, path) for path in paths), change_page  # the pages with stored files
