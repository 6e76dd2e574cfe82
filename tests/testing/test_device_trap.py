"""The default-device trap: package code that makes tensors without ``device=`` fails on CPU as it would on a GPU."""

from __future__ import annotations

import pytest
import torch

from kglightning.metrics.classification import detection_metrics, detection_scores
from kglightning.metrics.functional import unique_by_key
from kglightning.testing import DeviceTrap, DeviceTrapCallback, quiet_trainer


def test_package_tensors_without_a_device_go_to_meta_and_fail_beside_real_ones():
    probs, target = torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 0, 0])
    with DeviceTrap() as trap:
        metrics = detection_metrics()  # package code building Metric states on the default device
        with pytest.raises((RuntimeError, NotImplementedError)):
            metrics.update(probs, target)
            metrics.compute()["f1"].item()
    assert trap.sites and all(site.startswith("metrics/classification.py:") for site in trap.sites)


def test_code_that_takes_devices_from_its_inputs_passes_and_outside_code_is_untouched():
    probs, target = torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 0, 0])
    with DeviceTrap() as trap:
        scores = detection_scores(probs, target)  # torchmetrics' functional code on the inputs' device
        keep = unique_by_key(torch.tensor([4, 1, 4]))
        mine = torch.zeros(2)  # test code: not trapped
    assert scores["f1"].device.type == "cpu" and keep.tolist() == [1, 0] and mine.device.type == "cpu"
    assert trap.sites == []


def test_data_preparation_is_exempt_and_watch_narrows_the_trap():
    from kglightning.data.relation_pairs import RelationPair, collate_pairs  # batches are built on the CPU by design

    pairs = [RelationPair("q", "r", 1.0, "id")]
    with DeviceTrap() as trap:
        assert collate_pairs(pairs)["label"].device.type == "cpu"
    assert trap.sites == []
    with DeviceTrap(watch=("data",)) as trap:
        assert collate_pairs(pairs)["label"].device.type == "meta"
    assert trap.sites and trap.sites[0].startswith("data/relation_pairs.py:")
    with DeviceTrap(watch=("nn",)) as trap:
        detection_metrics()
    assert trap.sites == []


@pytest.mark.no_device_trap  # this test puts its own trap on the Trainer
@pytest.mark.parametrize("leaky", [False, True])
def test_the_callback_traps_every_hook_after_the_module_is_placed(leaky, tmp_path):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            probs = torch.sigmoid(self.layer(batch[0])).flatten().detach()
            target = (probs > 0.5).long()
            if leaky:  # a metric built inside a hook keeps its states on the default device
                self.log("f1", detection_metrics()(probs, target)["f1"])
            else:
                self.log("f1", detection_scores(probs, target)["f1"])
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    callback = DeviceTrapCallback()
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[callback])
    if leaky:
        with pytest.raises((RuntimeError, NotImplementedError)):
            trainer.fit(Module(), data)
        assert callback.trap.sites
    else:
        trainer.fit(Module(), data)
        assert callback.trap.sites == []
    assert not torch._C._is_torch_function_mode_enabled()  # left at the end of fit, or on the exception
