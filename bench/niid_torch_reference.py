#!/usr/bin/python3
"""NIID-Bench's FedAvg / FedProx on Fashion-MNIST in plain PyTorch, for comparing Tessera's
table cells with the same computation outside Tessera (docs/benchmarks/accuracy.md, "NIID-Bench").

The setting of the paper and of Flower's rerun: 10 parties all training every round, SimpleCNN,
10 local epochs, batch 64 (shuffled, last batch kept), SGD lr 0.01 momentum 0.9 weight decay
1e-5 with a fresh optimiser per round, the sample-weighted mean of the parties' models,
pixels x / 255 (no normalisation), the test set evaluated after every round. Parties are made
by the label-quantity (#C=k) procedure on numpy's default_rng(seed): party i holds label
i mod 10 and k - 1 more drawn labels; each label's shuffled samples are split evenly among the
parties that hold it.

Prints `round R accuracy A loss L seconds S` per round and the label sets first.
Run with Debian's /usr/bin/python3 (which has torch):

    /usr/bin/python3 bench/niid_torch_reference.py --rounds 50 --labels-per-party 2
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

DATA = "/usr/share/datasets/fashion-mnist"


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(256, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


def read_idx(prefix):
    with gzip.open(os.path.join(DATA, prefix + "-images-idx3-ubyte.gz"), "rb") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, prefix + "-labels-idx1-ubyte.gz"), "rb") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels)


def label_quantity_parties(labels, parties, per_party, rng):
    classes = 10
    holders = [0] * classes
    sets = []
    for i in range(parties):
        held = [i % classes]
        holders[i % classes] += 1
        while len(held) < per_party:
            extra = int(rng.choice(classes, 1)[0])
            if extra not in held:
                held.append(extra)
                holders[extra] += 1
        sets.append(held)
    shares = [[] for _ in range(parties)]
    for k in range(classes):
        members = np.where(labels == k)[0]
        rng.shuffle(members)
        pieces = np.array_split(members, holders[k])
        taken = 0
        for p in range(parties):
            if k in sets[p]:
                shares[p] += pieces[taken].tolist()
                taken += 1
    return sets, [np.array(s, dtype=np.int64) for s in shares]


def train_party(model, images, labels, args, generator):
    optimiser = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-5)
    anchor = [p.detach().clone() for p in model.parameters()] if args.mu > 0 else None
    model.train()
    n = images.shape[0]
    for _ in range(args.epochs):
        order = torch.randperm(n, generator=generator)
        for first in range(0, n, args.batch):
            pick = order[first:first + args.batch]
            optimiser.zero_grad()
            loss = nn.functional.cross_entropy(model(images[pick]), labels[pick])
            if anchor is not None:
                loss = loss + args.mu / 2 * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
            loss.backward()
            optimiser.step()


def evaluate(model, images, labels):
    model.eval()
    with torch.no_grad():
        logits = model(images)
        loss = nn.functional.cross_entropy(logits, labels).item()
        accuracy = (logits.argmax(1) == labels).float().mean().item()
    return accuracy, loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--labels-per-party", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--mu", type=float, default=0.0, help="FedProx's proximal mu (0: FedAvg)")
    parser.add_argument("--seed", type=int, default=42, help="the partition's numpy seed")
    parser.add_argument("--torch-seed", type=int, default=0, help="initialisation and batch order")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not (1 <= args.labels_per_party <= 10 and 1 <= args.parties <= 100 and args.rounds >= 1):
        sys.exit("niid_torch_reference: --labels-per-party must be 1-10, --parties 1-100, --rounds >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.torch_seed)
    generator = torch.Generator().manual_seed(args.torch_seed)

    train_x, train_y = read_idx("train")
    test_x, test_y = read_idx("t10k")
    sets, shares = label_quantity_parties(train_y.numpy(), args.parties, args.labels_per_party,
                                          np.random.default_rng(args.seed))
    print("party_labels", sets, "sizes", [len(s) for s in shares], flush=True)

    model = SimpleCNN()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    total = float(sum(len(s) for s in shares))
    for r in range(1, args.rounds + 1):
        began = time.time()
        summed = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        for share in shares:
            model.load_state_dict(global_state)
            index = torch.from_numpy(share)
            train_party(model, train_x[index], train_y[index], args, generator)
            weight = len(share) / total
            for k, v in model.state_dict().items():
                summed[k] += weight * v.double()
        global_state = {k: v.float() for k, v in summed.items()}
        model.load_state_dict(global_state)
        accuracy, loss = evaluate(model, test_x, test_y)
        print(f"round {r} accuracy {accuracy * 100:.2f} loss {loss:.4f} seconds {time.time() - began:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
