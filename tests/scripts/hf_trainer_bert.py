"""A tiny BERT classifier under the HF Trainer whose labels go out of range in a later batch.

Built from a config object (no downloads); 3 classes, and example 13 is labelled 3.
`python hf_trainer_bert.py OUTPUT_DIR [cuda]`: on CUDA the bad label is a device-side assert.
"""

import sys

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Examples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 50, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": torch.tensor(3 if i == 13 else i % 3)}


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=sys.argv[1],
        per_device_train_batch_size=4,
        max_steps=6,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=sys.argv[2:] != ["cuda"],
    )
    trainer = Trainer(model=model, args=args, train_dataset=Examples())
    trainer.train()


if __name__ == "__main__":
    main()
