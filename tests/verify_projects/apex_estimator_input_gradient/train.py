"""A CPU-sized FGSM adversarial-training script written for ampmigrate's tests: the estimator
(estimator.py) sets apex up and trains; each step's adversarial inputs come from the sign of its
`loss_gradient()`, a scaled backward that steps nothing. The data are synthetic: a 4-class
classification on 16 features.

    python train.py --opt-level O1
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from estimator import Classifier


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--opt-level", type=str, default="O1", choices=["O0", "O1", "O2"])
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    classifier = Classifier(model, nn.CrossEntropyLoss(), optimizer, use_amp=True, opt_level=args.opt_level)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            x_adv = x + args.epsilon * classifier.loss_gradient(x, y).sign()
            loss = classifier.fit_batch(x_adv, y)
            if step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss:.4f}")


if __name__ == "__main__":
    main()
