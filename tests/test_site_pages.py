"""The site's pages as one site: the catalogue and records pages in its style and with numbers for people, its 403
page for a researcher on an admin-only page, and the branded Django admin."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord


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

    assert "<title>Records | FC² platform admin</title>" in page
    assert '<a href="/admin/">FC² platform admin</a>' in page
    assert '<a href="/">View site</a>' in page
