"""The library: one entry per wheel however often it is uploaded; a page per bundle and dataset, rename, delete."""

import pytest
from django.conf import settings
from django.urls import reverse

from fc2.models import CodeBundle, Dataset, Job
from fc2.services import datasets, library
from fc2.services.bundles import store_bundle
from fc2.wizard import DataForm
from monitor.agent import DATASET_FETCH_FAILED
from tests.conftest import make_job
from tests.helpers import code_form, good_npz, post_report, resource_form, start_running


def test_same_wheel_twice_is_one_bundle(alice, bundle, example_wheel):
    with example_wheel.open("rb") as wheel:
        again = store_bundle(alice, wheel, example_wheel.name)

    assert again.pk == bundle.pk
    assert CodeBundle.objects.filter(owner=alice).count() == 1
    folders, _ = bundle.wheel.storage.listdir(f"bundles/{alice.pk}")
    assert len(folders) == 1


def test_same_wheel_by_another_owner_is_their_own(bob, bundle, example_wheel):
    with example_wheel.open("rb") as wheel:
        theirs = store_bundle(bob, wheel, example_wheel.name)

    assert theirs.pk != bundle.pk
    assert theirs.owner == bob


@pytest.fixture
def upload(alice):
    return datasets.store_upload(alice, good_npz())


def page(client, user, item):
    client.force_login(user)
    return client.get(reverse(kind(item), args=[item.pk]))


def kind(item) -> str:
    return "bundle" if isinstance(item, CodeBundle) else "dataset"


@pytest.mark.parametrize("which", ["bundle", "upload"])
def test_page_shows_what_it_is_and_no_server_path(client, alice, request, which):
    item = request.getfixturevalue(which)

    response = page(client, alice, item)

    assert response.status_code == 200
    assert item.name in response.text
    stored = item.wheel if which == "bundle" else item.file
    assert stored.name not in response.text
    assert str(settings.MEDIA_ROOT) not in response.text


@pytest.mark.parametrize("which", ["bundle", "upload"])
def test_someone_elses_page_is_404_and_an_admin_sees_it(client, bob, request, which, django_user_model):
    item = request.getfixturevalue(which)

    assert page(client, bob, item).status_code == 404
    client.post(reverse(f"{kind(item)}-delete", args=[item.pk]))
    assert type(item).objects.filter(pk=item.pk).exists()
    admin = django_user_model.objects.create_user("carol", "carol@example.com", "carol-password-1", is_staff=True)
    assert page(client, admin, item).status_code == 200


def test_home_links_each_page(client, alice, bundle, upload):
    client.force_login(alice)

    response = client.get(reverse("home"))

    assert reverse("bundle", args=[bundle.pk]) in response.text
    assert reverse("dataset", args=[upload.pk]) in response.text


@pytest.mark.parametrize("which", ["bundle", "upload"])
def test_owner_renames(client, alice, request, which):
    item = request.getfixturevalue(which)
    client.force_login(alice)

    client.post(reverse(f"{kind(item)}-rename", args=[item.pk]), {"name": "  my data  "})

    item.refresh_from_db()
    assert item.name == "my data"


def test_new_bundle_is_named_after_its_distribution(bundle):
    assert bundle.name == bundle.distribution


@pytest.mark.parametrize("which", ["bundle", "upload"])
def test_delete_unused_removes_row_and_file(client, alice, request, which):
    item = request.getfixturevalue(which)
    stored = item.wheel if which == "bundle" else item.file
    storage, name = stored.storage, stored.name
    client.force_login(alice)

    response = client.post(reverse(f"{kind(item)}-delete", args=[item.pk]))

    assert response.status_code == 302
    assert not type(item).objects.filter(pk=item.pk).exists()
    assert not storage.exists(name)


@pytest.mark.parametrize("which", ["bundle", "dataset"])
def test_delete_refused_while_a_job_used_it(client, alice, bundle, upload, which):
    job = make_job(alice, bundle, upload)
    item = job.bundle if which == "bundle" else job.dataset
    stored = item.wheel if which == "bundle" else item.file
    client.force_login(alice)

    response = client.post(reverse(f"{which}-delete", args=[item.pk]), follow=True)

    assert "Not deleted: 1 job used it" in response.text
    assert type(item).objects.filter(pk=item.pk).exists()
    assert stored.storage.exists(stored.name)
    assert f"Job #{job.pk}" in response.text


@pytest.fixture
def remote(alice):
    url = "https://data.example.org/points.npz"
    return Dataset.objects.create(owner=alice, kind=Dataset.Kind.URL, name="points", url=url, path=url)


def test_failed_download_marks_the_dataset_until_a_job_on_it_succeeds(client, alice, job, remote):
    job.dataset = remote
    token = start_running(job)
    failure = f"{DATASET_FETCH_FAILED} {remote.url}: cannot download {remote.url}: URLError: timed out"

    post_report(client, job.pk, {"node": "chief-0", "status": "failed", "exit_code": None, "log_tail": failure}, token)

    remote.refresh_from_db()
    assert remote.last_error == failure
    assert "could not fetch this dataset" in page(client, alice, remote).text
    assert "last download failed" in DataForm._dataset_label(remote)
    assert "download failed" in client.get(reverse("home")).text

    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    post_report(client, job.pk, {"node": "chief-0", "status": "succeeded", "exit_code": 0}, token)

    remote.refresh_from_db()
    assert remote.last_error == ""


def test_a_failing_program_does_not_mark_its_dataset(client, job, remote):
    job.dataset = remote
    token = start_running(job)

    post_report(
        client, job.pk, {"node": "chief-0", "status": "failed", "exit_code": 2, "log_tail": "ValueError"}, token
    )

    remote.refresh_from_db()
    assert remote.last_error == ""


def test_a_renamed_bundle_is_found_and_offered_by_its_name(client, alice, bundle):
    library.rename(bundle, "resnet trial")
    client.force_login(alice)

    assert "resnet trial" in client.get(reverse("home"), {"q": "resnet"}).text
    assert "resnet trial" in client.get(reverse("job-new-step", args=["code"])).text


def test_the_wizard_review_shows_no_server_path_of_an_uploaded_dataset(client, alice, bundle, upload):
    client.force_login(alice)
    client.post(reverse("job-new-step", args=["code"]), code_form(bundle=bundle))
    client.post(reverse("job-new-step", args=["data"]), {"source": "mine", "dataset": upload.pk})
    client.post(reverse("job-new-step", args=["resource"]), resource_form())

    response = client.get(reverse("job-new-step", args=["review"]))

    assert response.status_code == 200 and upload.name in response.text
    assert upload.file.name not in response.text and str(settings.MEDIA_ROOT) not in response.text


def test_an_empty_name_is_refused_with_its_reason(client, alice, upload):
    client.force_login(alice)

    response = client.post(reverse("dataset-rename", args=[upload.pk]), {"name": "  "}, follow=True)

    assert "Not renamed: a name cannot be empty" in response.text
    upload.refresh_from_db()
    assert upload.name == "points"  # its file's name without the extension, unchanged
