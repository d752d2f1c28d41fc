"""A sibling trainer that reaches `amp` (and `torch`, `ModelTrainer`) through `from trainer import *`,
as flair's distillation and fine-tuning trainers do; the loss comes from one of two methods of the
model, then is divided for gradient accumulation."""

from trainer import *


class FinetuneTrainer(ModelTrainer):
    def __init__(self, model, loader, teacher=None, lr=0.05, accumulation_steps=2):
        super().__init__(model, loader, lr)
        self.teacher = teacher
        self.accumulation_steps = accumulation_steps

    def train(self, epochs, use_amp=False):
        if use_amp and amp is None:
            raise RuntimeError("Failed to import apex. Please install apex to enable mixed-precision training.")
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9)
        if use_amp:
            self.model, optimizer = amp.initialize(self.model, optimizer, opt_level="O1")
        step = 0
        for epoch in range(epochs):
            for batch_no, batch in enumerate(self.loader):
                if self.teacher is not None:
                    with torch.no_grad():
                        teacher_logits = self.teacher(batch[0])
                    loss = self.model.distillation_loss(batch, teacher_logits)
                else:
                    loss = self.model.forward_loss(batch)
                loss = loss / self.accumulation_steps
                if use_amp:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                if (batch_no + 1) % self.accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    step += 1
                    if step % 10 == 0:
                        print(f"step {step} loss {loss.item():.4f}")
