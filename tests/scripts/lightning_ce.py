"""A LightningModule whose training_step computes a cross-entropy with a bad target at step 4.

Lightning runs training_step inside `optimizer.step(closure)`: the loss is in forward.
"""

import lightning as L
import torch
import torch.nn.functional as F


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(48, 8)
    y = torch.randint(0, 5, (48,))
    y[37] = 5  # batch 4 (8 per batch) holds a target past the 5 classes
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
