"""explore where people meet it: the wizard's fields and its search's estimate before anything runs, the jobs API's
fields and 400s, `submit_job --algorithm explore` and `fc2 submit`/`fc2 status`, and the job page's Search section
(issue 44 §1). The job rows with trial entries and a search are test data, as the trial runner writes them."""

from __future__ import annotations

import doctest
import re
from datetime import timedelta

import pytest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from fc2_client import cli, display

import provisioner
from fc2.models import Job
from fc2.services import planning, search
from fc2.services.planning import Plan
from fc2.services.requests import SubmitError
from fc2.wizard import ResourceForm
from recommender import service
from recommender.catalog import load_catalog
from recommender.types import SearchEstimate, TrialConfig
from tests.conftest import call_json
from tests.helpers import Api, job_row, resource_form, step_url, through_data
from tests.test_explore_plan import full_lab_grid

NOW = timezone.now()


def at(minutes: float) -> str:
    return (NOW - timedelta(minutes=minutes)).isoformat()


def trial(number: int, worker_type: str, workers: int, *, ended: float | None, epoch: float | None = None, **extra):
    """A trial entry of Job.profiling_runs as fc2/services/trials.py writes it (shared-interface.md)."""
    return {
        "kind": "trial", "number": number, "worker_type": worker_type, "ps_type": "lab-ps-450", "workers": workers,
        "strategy": "ps", "batch_size": 32, "cluster": f"fc2-1-t{number}", "hourly_cost": 0.325 + 0.2 * (workers - 1),
        "started_at": at(10 - 4 * (number - 1)), "window_ends_at": at(8 - 4 * (number - 1)),
        "ended_at": None if ended is None else at(ended), "epoch_time_s": epoch, "error": "", "record": None, **extra,
    }  # fmt: skip


CFG_BEFORE = {"worker_type": "lab-w-100", "ps_type": "lab-ps-450", "workers": 2, "strategy": "ps",
              "hourly_cost": 0.525, "epoch_time_s": 30.0, "low_s": 12.0, "high_s": 75.0}  # fmt: skip
CFG_AFTER = {"worker_type": "lab-w-1g", "ps_type": "lab-ps-450", "workers": 3, "strategy": "ps",
             "hourly_cost": 0.875, "epoch_time_s": 11.5, "low_s": 10.8, "high_s": 12.4}  # fmt: skip
SEARCH = {"before": CFG_BEFORE, "after": CFG_AFTER, "reason": "another trial's expected gain ($0.002) is worth less "
          "than its cost ($0.02)", "trials": 3, "spent_dollars": 0.061, "budget_dollars": 5.0, "budget_minutes": 30,
          "no_trial_needed": False}  # fmt: skip


@pytest.fixture
def lab(db):
    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    return load_catalog("lab")


def explore_job(owner, **fields) -> Job:
    fields = {"algorithm": "explore", "provider": "lab", "catalog": "lab", "parameters": {"epochs": "4"}, **fields}
    return job_row(owner, **fields)


# --- what "best" means: one rule at every door ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "alpha", "beta", "expected"),
    [
        ("fastest", None, None, (1.0, 0.0)),
        ("cheapest", None, None, (0.0, 1.0)),
        (None, None, None, (0.5, 0.5)),
        (None, 2.0, None, (2.0, 0.5)),
        (None, 0.0, 3.0, (0.0, 3.0)),
    ],
)
def test_weights_from_a_preset_or_as_given(preset, alpha, beta, expected):
    assert search.weights(preset, alpha, beta) == expected


def test_a_preset_with_weights_too_is_refused_naming_the_preset():
    with pytest.raises(SubmitError, match="give the preset 'fastest' or alpha and beta, not both") as refused:
        search.weights("fastest", 1.0, None)
    assert refused.value.field == "preset"


@pytest.mark.parametrize(("alpha", "beta", "preset"), [(1.0, 0.0, "fastest"), (0.5, 0.5, "balanced"), (2, 1, "custom")])
def test_a_reruns_wizard_shows_the_preset_asked(alpha, beta, preset):
    assert search.preset_of(alpha, beta) == preset


# --- the job page ---------------------------------------------------------------------------------------------------


def test_the_job_page_shows_the_search_as_it_happens(client, alice):
    """While the job recommends: each trial with its cluster, state (measured, failed and why, under way), measured
    epoch time and cost ($/h × its span so far); the progress line says which trial runs; the page polls."""
    runs = [
        trial(1, "lab-w-100", 2, ended=6, epoch=30.5),
        trial(2, "lab-w-250", 1, ended=4, error="the chief exited with code 1: ValueError: bad shape"),
        trial(3, "lab-w-1g", 3, ended=None),
    ]
    job = explore_job(alice, state=Job.State.RECOMMENDING, profiling_runs=runs)
    client.force_login(alice)
    page = client.get(job.get_absolute_url()).content.decode()
    section = page[page.index('id="search"') : page.index("</section>", page.index('id="search"'))]
    assert "trial 3 under way" in section
    assert 'data-trial="1"' in section and "2 × lab-w-100 + PS lab-ps-450" in section and "30.5 s" in section
    assert "measured" in section
    assert "failed" in section and "the chief exited with code 1: ValueError: bad shape" in section
    assert "under way" in section and "3 × lab-w-1g" in section
    # Trial 1: $0.525/h for 4 minutes.
    assert "≈ $0.035" in section
    rows = search.trials(job)
    assert [row.state for row in rows] == ["measured", "failed", "under way"]
    assert rows[0].cost == pytest.approx(0.525 * 4 / 60)
    assert f"{search.of_job(job).spent:.4f}" == f"{sum(row.cost for row in rows):.4f}"
    assert 'id="job-trial"' in page and "trial 3 under way</strong> on 3 × lab-w-1g, a short run" in page
    assert "profiling" not in page[page.index('id="job-progress-text"') :][:400]
    assert 'hx-get="' + reverse("job-live", args=[job.pk]) in page
    live = client.get(reverse("job-live", args=[job.pk])).content.decode()
    assert 'id="search"' in live and "trial 3 under way" in live


def test_trials_at_once_are_each_under_way_on_the_page_and_in_the_line(client, alice):
    """Trials that overlap (aws: a batch at once) are every one under way, and said together."""
    runs = [trial(1, "c4.xlarge", 1, ended=6, epoch=3.0), trial(2, "c4.xlarge", 2, ended=None)]
    runs += [trial(3, "m4.xlarge", 2, ended=None) | {"started_at": runs[1]["started_at"]}]
    job = explore_job(alice, state=Job.State.RECOMMENDING, profiling_runs=runs)
    found = search.of_job(job)
    assert [row.number for row in found.running] == [2, 3] and found.running_text == "trials 2 and 3 under way"
    assert "trials 2 and 3 under way" in search.said(found)
    client.force_login(alice)
    page = client.get(job.get_absolute_url()).content.decode()
    assert 'id="search-status" role="status">trials 2 and 3 under way<' in page
    live = client.get(reverse("job-live", args=[job.pk])).content.decode()
    assert "<strong>trials 2 and 3 under way</strong> on 2 × c4.xlarge and 2 × m4.xlarge, short runs" in live


def test_the_job_page_shows_what_the_search_chose_and_why_it_stopped(client, alice):
    runs = [trial(n, "lab-w-1g", n, ended=8 - 4 * (n - 1) - 1, epoch=20.0 - n) for n in (1, 2, 3)]
    job = explore_job(alice, state=Job.State.SUCCEEDED, profiling_runs=runs, search=SEARCH, finished_at=NOW)
    client.force_login(alice)
    page = client.get(job.get_absolute_url()).content.decode()
    assert 'id="search-status" role="status">done' in page
    before = page[page.index('id="search-before"') :][:700]
    assert "2 × lab-w-100" in before and "predicted epoch 30 s" in before and "12 s–75 s" in before
    after = page[page.index('id="search-after"') :][:700]
    assert "3 × lab-w-1g" in after and "11.5 s" in after and "10.8 s–12.4 s" in after and "$0.875/h" in after
    # An epoch of 11.5 s at $0.875/h, and the whole job of 4 epochs with its start-up and teardown.
    assert "≈ $0.0028 an epoch" in after and "for 4 epochs" in after
    assert "another trial&#x27;s expected gain ($0.002) is worth less than its cost ($0.02)" in page
    assert 'id="search-spent"' in page and "of a $5.00, 30-minute search budget" in page
    assert "part of the job's cost" in page
    asked = "best: balanced (α 0.5, β 0.5) · search budget $5.00 and 30 minutes"
    assert f"explore · ps · at most 2 workers · {asked}" in page


def test_a_search_that_needed_no_trial_says_so(client, alice):
    done = {**SEARCH, "before": None, "trials": 0, "spent_dollars": 0.0, "no_trial_needed": True,
            "reason": "this workload's records already tell the best cluster"}  # fmt: skip
    job = explore_job(alice, state=Job.State.RUNNING, search=done)
    client.force_login(alice)
    page = client.get(job.get_absolute_url()).content.decode()
    assert 'id="search-no-trial"' in page and 'id="search-trials"' not in page and 'id="search-before"' not in page
    assert 'id="search-after"' in page


def test_only_an_explore_job_has_a_search_section(client, alice):
    job = job_row(alice, algorithm="cost-opt", state=Job.State.RECOMMENDING)
    client.force_login(alice)
    assert 'id="search"' not in client.get(job.get_absolute_url()).content.decode()
    assert search.of_job(job) is None


def test_a_trial_cut_off_by_the_job_ending_is_failed_not_under_way(alice):
    job = explore_job(alice, state=Job.State.CANCELLED, profiling_runs=[trial(1, "lab-w-1g", 1, ended=None)])
    (row,) = search.trials(job)
    assert row.state == "failed" and row.error == "cut off when the job was cancelled"


# --- the jobs API ---------------------------------------------------------------------------------------------------


def test_the_api_gives_a_jobs_trials_and_search(client, alice):
    runs = [trial(1, "lab-w-100", 2, ended=7, epoch=30.5), trial(2, "lab-w-1g", 3, ended=None)]
    job = explore_job(alice, state=Job.State.RECOMMENDING, profiling_runs=runs, search=SEARCH)
    answer = Api(client, alice).get(f"/api/v1/jobs/{job.pk}").json()
    assert answer["search"] == SEARCH
    first, second = answer["trials"]
    assert first["number"] == 1 and first["state"] == "measured" and first["epoch_time_s"] == 30.5
    assert first["cost"] == pytest.approx(0.525 * 3 / 60)
    assert second["state"] == "under way" and second["ended_at"] is None and second["worker_type"] == "lab-w-1g"
    assert answer["request"]["alpha"] == 0.5 and answer["request"]["search_budget"] is None
    other = job_row(alice, algorithm="cost-opt")
    plain = Api(client, alice).get(f"/api/v1/jobs/{other.pk}").json()
    assert plain["search"] is None and plain["trials"] == []


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"preset": "fastest", "alpha": 1}, "preset", "give the preset 'fastest' or alpha and beta, not both"),
        ({"preset": "quickest"}, "preset", '"quickest" is not a valid choice'),
        ({"alpha": -0.5}, "alpha", "greater than or equal to 0"),
        ({"alpha": 0, "beta": 0}, "alpha", "alpha and beta cannot both be 0"),
        ({"search_budget": 0}, "search_budget", "a search budget is an amount of dollars above $0"),
        ({"search_budget": "lots"}, "search_budget", "A valid number is required."),
        ({"search_minutes": 0}, "search_minutes", "greater than or equal to 1"),
        ({"search_minutes": 1.5}, "search_minutes", "A valid integer is required."),
        ({"total_budget": 1, "search_budget": 2}, "total_budget", "does not cover explore's search budget of $2.00"),
        ({"algorithm": "cost-opt", "search_budget": 2}, "search_budget", "search_budget is explore's"),
        ({"algorithm": "manual", "preset": "cheapest"}, "preset", "preset is explore's"),
    ],
)
def test_the_api_refuses_bad_explore_fields_with_a_400_naming_them(client, alice, bundle, lab, fields, field, words):
    body = {"bundle": bundle.pk, "dataset": "digits", "provider": "lab", "algorithm": "explore", **fields}
    response = Api(client, alice).post("/api/v1/jobs", body)
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["fields"][field])
    assert not Job.objects.exists()


# --- submit_job and the fc2 client ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--algorithm", "explore", "--preset", "fastest", "--beta", "1"), "--preset or --alpha and --beta: give"),
        (("--algorithm", "explore", "--alpha", "0", "--beta", "0"), "alpha and beta cannot both be 0"),
        (("--algorithm", "explore", "--search-budget", "0"), "a search budget is an amount of dollars above $0"),
        (("--algorithm", "explore", "--search-minutes", "0"), "a search's minutes are a whole number of at least 1"),
        (("--algorithm", "explore", "--provider", "local"), "explore chooses among instance types by running trials"),
        (("--algorithm", "cost-opt", "--search-minutes", "5"), "--search-minutes is explore's"),
    ],
)
def test_submit_job_refuses_bad_explore_flags(alice, example_wheel, lab, args, words):
    code, answer, _ = call_json(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice", "--provider", "lab",
        *args,
    )  # fmt: skip
    assert code == 1 and words in answer["error"]
    assert not Job.objects.exists()


def test_fc2_submit_sends_explore_fields():
    args = cli.build_parser().parse_args(
        ["submit", "x.whl", "--dataset", "digits", "--algorithm", "explore", "--preset", "cheapest",
         "--search-budget", "2.5", "--search-minutes", "20"]
    )  # fmt: skip
    payload = cli.job_payload(args, 7, "digits")
    assert payload == {"bundle": 7, "dataset": "digits", "parameters": {}, "algorithm": "explore",
                       "preset": "cheapest", "search_budget": 2.5, "search_minutes": 20}  # fmt: skip
    weights = cli.build_parser().parse_args(
        ["submit", "x.whl", "--dataset", "d", "--algorithm", "explore", "--alpha", "1", "--beta", "0.25"]
    )
    assert cli.job_payload(weights, 7, "d")["alpha"] == 1.0 and cli.job_payload(weights, 7, "d")["beta"] == 0.25
    assert "explore" in cli.ALGORITHMS


def test_fc2_status_says_the_trials_and_the_search_briefly():
    job = {
        "id": 9, "state": "running", "provider": "lab", "algorithm": "explore", "workers": 3, "worker_type": "lab-w-1g",
        "ps_type": "lab-ps-450", "strategy": "ps", "requested_strategy": "ps", "search": SEARCH,
        "trials": [
            {"number": 1, "workers": 2, "worker_type": "lab-w-100", "ps_type": "lab-ps-450", "strategy": "ps",
             "state": "measured", "epoch_time_s": 30.5, "cost": 0.026, "error": ""},
            {"number": 2, "workers": 1, "worker_type": "lab-w-250", "ps_type": "", "strategy": "mirrored",
             "state": "failed", "epoch_time_s": None, "cost": 0.01, "error": "the chief exited with code 1"},
        ],
    }  # fmt: skip
    report = display.job_report(job)
    assert "  trial 1   2 × lab-w-100 + PS lab-ps-450: measured, epoch 30.5 s, ≈ $0.026" in report
    assert "  trial 2   1 × lab-w-250: failed (the chief exited with code 1), ≈ $0.01" in report
    assert "  search    2 trials ≈ $0.036 · chose 3 × lab-w-1g + PS lab-ps-450 · stopped: another trial's" in report


# --- the wizard -----------------------------------------------------------------------------------------------------


def test_the_wizard_offers_explore_with_its_defaults_filled_in(client, alice, bundle, lab, settings):
    settings.FC2_EXPLORE_USD, settings.FC2_EXPLORE_MINUTES = 7, 45
    client.force_login(alice)
    through_data(client, bundle)
    page = client.get(step_url("resource"), {"provider": "lab"}).content.decode()
    assert '<option value="explore">Find the best cluster for me</option>' in page
    assert 'name="search_budget" value="7"' in page and 'name="search_minutes" value="45"' in page
    assert 'name="preset" value="balanced"' in page and "Cheapest: cost counts, not time" in page
    assert 'name="alpha" value="0.5"' in page


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"preset": "custom", "alpha": "0", "beta": "0"}, "alpha", "alpha and beta cannot both be 0"),
        ({"preset": "custom", "alpha": "-1"}, "alpha", "greater than or equal to 0"),
        ({"search_budget": "0"}, "search_budget", "The search&#x27;s budget must be more than $0."),
        ({"total_budget": "1", "search_budget": "2"}, "total_budget", "does not cover explore&#x27;s search budget"),
        ({"search_minutes": "0"}, "search_minutes", "greater than or equal to 1"),
    ],
)
def test_the_wizard_refuses_bad_explore_fields_beside_them(client, alice, bundle, lab, fields, field, words):
    client.force_login(alice)
    through_data(client, bundle)
    form = resource_form(provider="lab", algorithm="explore", catalog="lab", **fields)
    response = client.post(step_url("resource"), form)
    assert response.status_code == 400
    assert field in response.context["form"].errors
    assert words in response.content.decode()


def test_a_preset_is_what_the_request_weighs_by(alice, lab):
    form = ResourceForm(
        resource_form(provider="lab", algorithm="explore", catalog="lab", preset="fastest", alpha="0.2", beta="9",
                      search_budget="2.50", search_minutes="12"), user=alice,
    )  # fmt: skip
    assert form.is_valid(), form.errors
    state = form.state()
    assert (state["alpha"], state["beta"], state["search_budget"], state["search_minutes"]) == (1.0, 0.0, "2.50", 12)


def search_estimate(**fields) -> SearchEstimate:
    first = TrialConfig("lab-w-1g", 2, "lab-ps-450", "ps", 0.625)
    best = TrialConfig("lab-w-1g", 3, "lab-ps-450", "ps", 0.875)
    values = {
        "workload": "fc2-digits-cnn:digits", "next": first, "candidates": 36, "trials_made": 0, "trials_at_most": 9,
        "dollars": 0.083, "dollars_at_most": 5.0, "minutes": 12.4, "minutes_at_most": 30.0, "trial_minutes": 3.1,
        "reason": "no record of this workload yet", "predicted": (14.0, 6.5, 31.0), "predicted_config": best,
        "text": "3 trial runs of about 3 min each, ≈ $0.083 and 12 min, starting with 2 × lab-w-1g + PS lab-ps-450.",
        **fields,
    }  # fmt: skip
    return SearchEstimate(**values)


def search_plan(estimate: SearchEstimate) -> Plan:
    first = estimate.next
    return Plan(strategy="ps", ps_type=first.ps_type, worker_type=first.worker_type, workers=first.workers,
                hourly_cost=None, predicted_epoch_time_s=None, source="explore", explanation=estimate.text,
                recommendation=None, provider="lab", search=estimate)  # fmt: skip


def test_the_wizard_shows_the_searchs_estimate_before_anything_runs():
    shown = render_to_string("fc2/wizard/_recommendation.html", {"plan": search_plan(search_estimate())})
    assert "Trial runs first" in shown
    first = shown[shown.index('id="search-first-trial"') :][:400]
    assert "2 × lab-w-1g" in first and "+ PS lab-ps-450" in first and "$0.625/h" in first
    assert "≈ $0.083" in shown and "at most $5.00" in shown
    assert "12 min" in shown and "at most 30 min" in shown
    assert 'id="search-trial-minutes">3.1 min' in shown
    assert "starting with 2 × lab-w-1g + PS lab-ps-450" in shown
    assert "Chosen among 36 configurations" in shown and "at most 9 more trials" in shown
    assert "Believed best now: 3 × lab-w-1g + PS lab-ps-450, an epoch of 14 s (6.5 s–31 s)" in shown


def explore_form(**fields) -> dict:
    return resource_form(provider="lab", algorithm="explore", catalog="lab", max_workers="3", **fields)


def test_the_wizard_estimates_the_search_of_new_code_and_runs_it(client, alice, bundle, lab, settings):
    """Code never run: the resource step's live preview and the review show the search's estimate (its first trial,
    its expected $ and minutes within the budget, one trial's length); Run submits the job with what was asked."""
    settings.FC2_EXPLORE_USD = 4
    client.force_login(alice)
    through_data(client, bundle)
    preview = client.get(reverse("job-new-recommendation"), explore_form(preset="cheapest")).content.decode()
    assert "Trial runs first" in preview and 'id="search-first-trial"' in preview
    assert "at most $4.00" in preview and "at most 30 min" in preview
    response = client.post(step_url("resource"), explore_form(preset="cheapest", search_minutes="20"))
    assert response.status_code == 302, response.context["form"].errors
    review = client.get(step_url("review")).content.decode()
    assert "The search for your cluster" in review and 'id="search-estimate"' in review
    assert "Cheapest: cost counts, not time" in review and "α 0, β 1" in review
    assert "$4.00 (the platform's default) and 20 minutes" in review
    assert client.post(step_url("review")).status_code == 302
    job = Job.objects.get()
    asked = job.request
    assert (asked["algorithm"], asked["alpha"], asked["beta"]) == ("explore", 0.0, 1.0)
    assert (asked["search_budget"], asked["search_minutes"]) == (None, 20)
    # A re-run's wizard shows what was asked.
    client.get(reverse("job-new") + f"?from={job.pk}")
    again = client.get(step_url("resource")).content.decode()
    assert re.search(r'<input type="radio" name="preset" value="cheapest"[^>]*\bchecked\b', again)
    assert 'name="search_minutes" value="20"' in again
    assert 'name="search_budget" value="4"' in again  # left to the platform: its default, shown as it is


def test_the_wizard_says_when_the_records_already_tell(client, alice, bundle, lab):
    full_lab_grid(f"{bundle.distribution}:digits")
    client.force_login(alice)
    through_data(client, bundle)
    preview = client.get(reverse("job-new-recommendation"), explore_form()).content.decode()
    assert 'id="plan-no-trial"' in preview and "no trial needed" in preview and "Trial runs first" not in preview


def test_the_wizard_refuses_explore_on_local_with_the_reason(client, alice, bundle, lab):
    client.force_login(alice)
    through_data(client, bundle)
    page = client.get(step_url("resource")).content.decode()
    reason = "explore chooses among instance types by running trials of your code on them"
    assert re.search(r'<option value="explore" disabled[^>]*>Find the best cluster for me', page)
    assert "<strong>Find the best cluster for me</strong> cannot answer: " + reason in page
    response = client.post(step_url("resource"), resource_form(algorithm="explore"))
    assert response.status_code == 400 and reason in response.context["form"].errors["algorithm"][0]


def test_the_api_and_submit_job_take_an_explore_job(client, alice, bundle, lab, example_wheel):
    body = {"bundle": bundle.pk, "dataset": "digits", "provider": "lab", "algorithm": "explore", "workers": 3,
            "preset": "fastest", "search_budget": "2.5", "search_minutes": 15}  # fmt: skip
    response = Api(client, alice).post("/api/v1/jobs", body)
    assert response.status_code == 201, response.content
    asked = response.json()["request"]
    assert (asked["alpha"], asked["beta"], asked["search_budget"], asked["search_minutes"]) == (1.0, 0.0, 2.5, 15)
    assert response.json()["trials"] == [] and response.json()["search"] is None
    code, answer, _ = call_json(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice", "--provider", "lab",
        "--algorithm", "explore", "--alpha", "2", "--beta", "1", "--search-budget", "3", "--search-minutes", "9",
    )  # fmt: skip
    assert code == 0 and answer["search"] is None
    asked = Job.objects.get(pk=answer["id"]).request
    assert (asked["alpha"], asked["beta"], asked["search_budget"], asked["search_minutes"]) == (2.0, 1.0, "3", 9)


def test_a_search_that_found_nothing_shows_its_trials_and_the_jobs_reason(client, alice):
    runs = [trial(1, "lab-w-100", 1, ended=8, error="the chief exited with code 1: ImportError")]
    reason = "explore found no cluster that runs this code: no trial measured it"
    job = explore_job(alice, state=Job.State.FAILED, profiling_runs=runs, failure_reason=reason, finished_at=NOW)
    client.force_login(alice)
    page = client.get(job.get_absolute_url()).content.decode()
    assert "the job ended before it chose a cluster" in page and "ImportError" in page and reason in page


def test_submit_job_says_the_search_in_a_line(alice):
    runs = [trial(1, "lab-w-100", 2, ended=6, epoch=30.5), trial(2, "lab-w-1g", 1, ended=None, error="")]
    # Trial 2 is under way since 6 minutes before NOW (the module's import), and counting: started now, as it is.
    runs[1]["started_at"] = (timezone.now() - timedelta(minutes=6)).isoformat()
    job = explore_job(alice, state=Job.State.RECOMMENDING, profiling_runs=runs, search=SEARCH)
    line = search.said(search.of_job(job))
    # Trial 1's $0.035 and trial 2's so far (6 minutes at $0.325/h).
    assert re.match(r"2 trials \(1 measured, 0 failed\) · ≈ \$0\.06\d+ · ", line)
    assert "trial 2 under way" in line and "stopped: another trial's expected gain" in line


def test_the_search_modules_examples(settings):
    settings.FC2_EXPLORE_USD, settings.FC2_EXPLORE_MINUTES = 5, 30
    assert doctest.testmod(search).failed == 0


# --- a trial's length: its window plus the provider's start-up and teardown, at every door ---------------------------


def test_a_trials_length_counts_its_providers_start_up_at_every_door(client, alice, lab, settings):
    """One rule (planning.trial_minutes: the provider's start-up and teardown as measured here, else its default):
    the job's plan, /api/v1/recommend and `manage.py recommend` given the provider; without one, the window alone;
    an unknown provider refused."""
    settings.FC2_EXPLORE_TRIAL_S = 60
    on_lab = planning.trial_minutes("lab")
    assert on_lab > 1 and on_lab == service.trial_minutes("lab") and service.trial_minutes("mars") is None
    asked = {"algorithm": "explore", "workload": "never-run", "catalog": "lab", "max_workers": 3}
    client.force_login(alice)
    for provider, minutes in (("lab", on_lab), (None, 1.0)):
        body = {**asked, "provider": provider} if provider else asked
        refused = client.post(reverse("api-recommend"), body, content_type="application/json").json()
        assert refused["search"]["trial_minutes"] == pytest.approx(minutes), provider
        args = ["--provider", provider] if provider else []
        code, out, _ = call_json("recommend", *EXPLORE_ARGS_LAB, *args)
        assert code == 1 and out["search"]["trial_minutes"] == pytest.approx(minutes), provider
    unknown = client.post(reverse("api-recommend"), {**asked, "provider": "mars"}, content_type="application/json")
    assert unknown.status_code == 400 and "unknown provider 'mars'" in str(unknown.json()["fields"]["provider"])
    code, out, _ = call_json("recommend", *EXPLORE_ARGS_LAB, "--provider", "mars")
    assert code == 1 and out["error"] == "unknown provider 'mars'"


EXPLORE_ARGS_LAB = ["--algorithm", "explore", "--workload", "never-run", "--catalog", "lab", "--max-workers", "3"]


def test_the_recommenders_trial_rule_is_the_one_its_setting_names(db, settings):
    """The recommender knows no provider: the rule it counts a trial by is the platform's, named by
    FC2_TRIAL_MINUTES_RULE (fc2.services.planning.known_trial_minutes); another named is the one used, none none."""
    assert service.trial_minutes("lab") == pytest.approx(planning.trial_minutes("lab"))
    settings.FC2_TRIAL_MINUTES_RULE = "builtins.len"  # any function of a provider's name
    assert service.trial_minutes("lab") == 3
    settings.FC2_TRIAL_MINUTES_RULE = ""
    assert service.trial_minutes("lab") is None
