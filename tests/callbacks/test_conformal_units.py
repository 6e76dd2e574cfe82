"""ConformalCallback on items that cluster in units (answers by question): one score per unit, units counted.

The simulations draw calibration questions whose answers share a question effect, ``s = b_q + 0.3 e``, and read the
coverage of the fitted ``qhat`` exactly from the known distribution (no test sample): a random answer of a new
question is covered with probability ``Phi(qhat / sqrt(1.09))``, every one of its ``m`` answers with
``E_b[Phi((qhat - b) / 0.3) ** m]``.
"""

from __future__ import annotations

import logging
import math

import lightning as L
import pytest
import torch

import kglightning.callbacks.conformal_thresholds as thresholds
from kglightning.callbacks import ConformalCallback, ConformalScores
from kglightning.conformal.functional import conformal_quantile, unit_scores

ALPHA, REPS = 0.1, 1000
_B = torch.linspace(-8, 8, 4001, dtype=torch.float64)
_W = torch.exp(-0.5 * _B**2) * (_B[1] - _B[0]) / math.sqrt(2 * math.pi)  # N(0, 1) quadrature weights


def _clustered(gen: torch.Generator, questions: int, answers: int) -> tuple[torch.Tensor, torch.Tensor]:
    b = torch.randn(questions, 1, generator=gen, dtype=torch.float64)
    s = b + 0.3 * torch.randn(questions, answers, generator=gen, dtype=torch.float64)
    return s.flatten(), torch.arange(questions).repeat_interleave(answers)


def _coverage(qhat: float, answers: int, per_unit: str) -> float:
    if math.isinf(qhat):
        return 1.0
    if per_unit == "one":
        return float(torch.special.ndtr(torch.tensor(qhat / math.sqrt(1.09))))
    return float((torch.special.ndtr((qhat - _B) / 0.3) ** answers * _W).sum())


def _simulate(questions: int, answers: int, per_unit: str = "one", units: bool = True) -> tuple[float, float, float]:
    """Mean and standard error of the coverage over ``REPS`` calibration draws of one group, and the share of
    draws with a finite ``qhat``."""
    gen = torch.Generator().manual_seed(questions * 100 + answers)
    cov, finite = [], 0
    for r in range(REPS):
        s, q = _clustered(gen, questions, answers)
        cb = ConformalCallback(alpha=ALPHA, fit_on="manual", by_group=True, per_unit=per_unit, seed=r)
        cb.fit_scores(s, torch.zeros_like(q), q if units else None)
        finite += math.isfinite(cb.group_qhat[0])
        cov.append(_coverage(cb.group_qhat[0], answers, per_unit))
    c = torch.tensor(cov, dtype=torch.float64)
    return float(c.mean()), float(c.std() / math.sqrt(REPS)), finite / REPS


@pytest.mark.parametrize("per_unit", ["one", "every"])
def test_units_make_the_coverage_exact_on_clustered_answers(per_unit):
    # 19 questions x 10 answers: the rank ceil(20 * 0.9) = 18 of 19 question scores, coverage exactly 18/20 = 0.9
    mean, se, _ = _simulate(19, 10, per_unit)
    assert 0.9 - 4 * se <= mean <= 0.9 + 4 * se, (mean, se)


def test_counting_answers_under_covers_and_units_refuse_a_group_of_five_questions(caplog):
    # the case: 5 questions x 10 answers; counted as 50 items, qhat is finite every time and covers ~0.85
    old, old_se, old_finite = _simulate(5, 10, units=False)
    assert old_finite == 1.0 and old < 0.9 - 10 * old_se
    # counted as 5 questions, ceil(6 * 0.9) = 6 > 5: no finite threshold is valid; full sets, and the warning says why
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        new, _, new_finite = _simulate(5, 10)
    assert new_finite == 0.0 and new == 1.0
    assert "group 0 has 5 calibration units (questions), too few for alpha=0.1 (need >= 9)" in caplog.text
    assert "(50 items; the items of one unit are not independent" in caplog.text


def test_a_rank_off_by_one_on_units_breaks_the_promise(monkeypatch):
    def off_by_one(scores, alpha):  # the (k - 1)-th smallest: slightly anti-conservative
        s = torch.sort(scores).values
        k = math.ceil((s.numel() + 1) * (1 - alpha))
        return torch.tensor(math.inf if k > s.numel() else float(s[max(k - 2, 0)]), dtype=torch.float64)

    monkeypatch.setattr(thresholds, "conformal_quantile", off_by_one)
    mean, se, _ = _simulate(19, 10)
    assert mean < 0.9 - 10 * se  # 17/20 = 0.85


def test_per_unit_scores_are_seeded_by_the_data_and_do_not_depend_on_item_order():
    gen = torch.Generator().manual_seed(0)
    s, q = _clustered(gen, 30, 4)
    keys = torch.arange(s.numel())
    a = ConformalCallback(alpha=0.2, fit_on="manual", seed=3)
    b = ConformalCallback(alpha=0.2, fit_on="manual", seed=3)
    perm = torch.randperm(s.numel(), generator=gen)
    assert a.fit_scores(s, units=q, keys=keys) == b.fit_scores(s[perm], units=q[perm], keys=keys[perm])
    assert a.n_cal == 30 and a.calibrated_on == "units" and a.state_dict()["calibrated_on"] == "units"
    # one seed, fresh data: the picked positions change (a pick fixed by the seed would take the same ones)
    picks = set()
    for _ in range(5):
        s2, _ = _clustered(gen, 30, 4)
        picked = thresholds.per_unit_scores(s2, q, "one", seed=3)
        picks.add(tuple((s2.view(30, 4) == picked[:, None]).double().argmax(1).tolist()))
    assert len(picks) == 5
    # "every" is the largest item score of each unit
    assert torch.equal(unit_scores(s, q, "every"), s.view(30, 4).amax(1))
    with pytest.raises(ValueError, match="units has 3 entries"):
        a.fit_scores(s, units=q[:3])
    with pytest.raises(ValueError, match="non-negative integer"):
        ConformalScores(torch.zeros(2, 2), units=torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="per_unit"):
        ConformalCallback(per_unit="some")  # type: ignore[arg-type]


class _Clustered(L.LightningModule):
    """Items (answers) with a unit id each (their question); candidate 0 is the true one."""

    def __init__(self, units: bool = True) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.units = units

    def conformal_scores(self, batch):
        s, q, k = batch
        scores = torch.stack([s.double(), 1 - s.double()], dim=1)
        labels = torch.zeros_like(scores, dtype=torch.bool)
        labels[:, 0] = True
        groups = (q % 2).long()
        units = q.long() if self.units and not (self.units == "some" and int(k[0]) > 0) else None
        return ConformalScores(scores, labels=labels, keys=k.long(), groups=groups, units=units)

    def validation_step(self, batch, batch_idx):
        return None

    def test_step(self, batch, batch_idx):
        return None


def _loader(questions: int, answers: int, seed: int) -> torch.utils.data.DataLoader:
    s, q = _clustered(torch.Generator().manual_seed(seed), questions, answers)
    data = torch.utils.data.TensorDataset(torch.sigmoid(s), q, torch.arange(s.numel()))
    return torch.utils.data.DataLoader(data, batch_size=16)


def test_fit_and_test_through_the_trainer_count_units(tmp_path):
    cb = ConformalCallback(alpha=0.2, fit_on="manual", by_group=True)
    loader = _loader(40, 5, 0)
    cb.fit(None, _Clustered(), loader)
    s, q, _ = (torch.cat(t) for t in zip(*list(loader)))
    assert cb.n_cal == 40 and cb.group_n_cal == {0: 20, 1: 20}
    expected = conformal_quantile(thresholds.per_unit_scores(s.double(), q, "one", 0, torch.arange(s.numel())), 0.2)
    assert cb.qhat == float(expected)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=tmp_path, callbacks=[cb])  # fmt: skip
    trainer.test(_Clustered(), _loader(30, 5, 1), verbose=False)
    metrics = trainer.callback_metrics
    assert {"test/conformal_unit_coverage", "test/conformal_unit_coverage/1"} <= set(metrics)
    # some batches with units and some without: an error, not a silent count of items
    with pytest.raises(ValueError, match="ConformalScores.units for 1 of 13 batches"):
        ConformalCallback(alpha=0.2, fit_on="manual").fit(None, _Clustered(units="some"), loader)
    # a checkpoint of before units was calibrated on items: its qhat is not trusted, it is fitted again (second
    # review of issue 57: it was used as it was, the under-covering case this change fixes)
    old = {k: v for k, v in cb.state_dict().items() if k not in ("calibrated_on", "per_unit")}
    again = ConformalCallback(alpha=0.2, by_group=True)
    again.load_state_dict(old)
    assert again.calibrated_on == "items" and again.per_unit == "one" and not again._restored
    current = ConformalCallback(alpha=0.2, by_group=True)
    current.load_state_dict(cb.state_dict())
    assert current._restored


def test_validation_mode_gathers_units_with_the_scores():
    from types import SimpleNamespace

    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), sanity_checking=False, world_size=1)
    model, loader = _Clustered(), _loader(40, 5, 0)
    cb = ConformalCallback(alpha=0.2, fit_on="validation", by_group=True)
    cb.on_validation_epoch_start(trainer, model)
    for i, batch in enumerate(loader):
        cb.on_validation_batch_end(trainer, model, None, batch, i)
    cb.on_validation_epoch_end(trainer, model)
    manual = ConformalCallback(alpha=0.2, fit_on="manual", by_group=True)
    manual.fit(None, model, loader)
    assert (cb.qhat, cb.n_cal, cb.group_qhat) == (manual.qhat, manual.n_cal, manual.group_qhat)
    assert cb.n_cal == 40 and cb.calibrated_on == "units"


class _SomeUnlabelled(_Clustered):
    """Every fourth question has no gold answer: its items are unlabelled."""

    def conformal_scores(self, batch):
        cs = super().conformal_scores(batch)
        cs.labelled = batch[1] % 4 != 0
        return cs


def test_unlabelled_items_left_out_of_calibration_are_counted_and_logged_once(caplog):
    loader = _loader(40, 5, 0)  # 40 questions of 5 answers: 10 questions (50 answers) unlabelled
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        cb = ConformalCallback(alpha=0.2, fit_on="manual")
        cb.fit(None, _SomeUnlabelled(), loader)
    assert cb.n_cal == 30
    assert caplog.text.count("left 50 unlabelled items (10 units) out of calibration") == 1
    # the validation mode counts them too, once per epoch's fit
    from types import SimpleNamespace

    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), sanity_checking=False, world_size=1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        cb = ConformalCallback(alpha=0.2, fit_on="validation")
        cb.on_validation_epoch_start(trainer, _SomeUnlabelled())
        for i, batch in enumerate(loader):
            cb.on_validation_batch_end(trainer, _SomeUnlabelled(), None, batch, i)
        cb.on_validation_epoch_end(trainer, _SomeUnlabelled())
    assert cb.n_cal == 30 and caplog.text.count("left 50 unlabelled items (10 units)") == 1
    caplog.clear()  # every item labelled: nothing to say
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        ConformalCallback(alpha=0.2, fit_on="manual").fit(None, _Clustered(), loader)
    assert "unlabelled" not in caplog.text
