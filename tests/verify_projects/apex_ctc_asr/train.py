#!/usr/bin/env python
"""A CPU-sized reduction, written for ampmigrate's tests, of tugstugi/mongolian-speech-recognition
train.py: a module-level script with `import apex`, `from apex.parallel import
DistributedDataParallel`, `from apex import amp`, `amp.initialize(model, optimizer, opt_level='O2')`
under `if args.mixed_precision:`, `apex.parallel.convert_syncbn_model` under `--sync-bn`, a
`train(epoch, phase)` function on the module's globals whose CTC loss is scaled only when
mixed_precision, and `clip_grad_norm_(amp.master_params(optimizer), ...)` before `optimizer.step()`
whenever `--clip-grad-norm` is positive (also in fp32 runs). The model is a tiny convolutional
CTC acoustic model (with batch norm, which O2 keeps in fp32) on synthetic feature frames.

    python train.py --mixed-precision
"""

import argparse
import os
import time

import apex
from apex.parallel import DistributedDataParallel
from apex import amp

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--logdir", type=str, default='logdir', help='log dir for checkpoints')
parser.add_argument("--train-batch-size", type=int, default=16, help='train batch size')
parser.add_argument("--valid-batch-size", type=int, default=16, help='valid batch size')
parser.add_argument("--weight-decay", type=float, default=1e-5, help='weight decay')
parser.add_argument("--clip-grad-norm", type=int, default=100, help='clip gradient norm value')
parser.add_argument("--lr", type=float, default=5e-3, help='learning rate for optimization')
parser.add_argument('--mixed-precision', action='store_true', help='enable mixed precision training')
parser.add_argument('--sync-bn', action='store_true', help='enable synchronized batch normalization')
parser.add_argument("--max-epochs", default=40, type=int, help="train epochs")
parser.add_argument("--local_rank", default=0, type=int)
args = parser.parse_args()

args.distributed = False
if 'WORLD_SIZE' in os.environ:
    args.distributed = int(os.environ['WORLD_SIZE']) > 1

vocab = "_abcdefghij"
num_features = 16


def make_dataset(samples, seed):
    gen = torch.Generator().manual_seed(seed)
    templates = torch.randn(len(vocab), num_features, generator=gen)
    targets = torch.randint(1, len(vocab), (samples, 6), generator=gen)
    frames = templates[targets].repeat_interleave(4, dim=1)  # each symbol lasts 4 frames: T = 24
    inputs = frames.transpose(1, 2) + 0.3 * torch.randn(samples, num_features, 24, generator=gen)
    return TensorDataset(inputs, targets, torch.full((samples,), 24), torch.full((samples,), 6))


class Speech2TextCRNN(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv1d(num_features, 64, kernel_size=3, stride=2, padding=1), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 64, kernel_size=3, padding=1), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, len(vocab), kernel_size=1))

    def forward(self, x):
        return self.layers(x)


def save_checkpoint(logdir, epoch, global_step, model, optimizer):
    checkpoint_file_name = os.path.join(logdir, 'epoch-%04d.pth' % epoch)
    print("saving the checkpoint file '%s'..." % checkpoint_file_name)
    checkpoint = {
        'epoch': epoch + 1,
        'global_step': global_step,
        'state_dict': model.state_dict(),
        'optimizer': optimizer.state_dict(),
    }
    torch.save(checkpoint, checkpoint_file_name)
    del checkpoint


train_dataset, valid_dataset = make_dataset(640, 5), make_dataset(64, 6)
train_data_loader = DataLoader(train_dataset, batch_size=args.train_batch_size, shuffle=True, drop_last=True)
valid_data_loader = DataLoader(valid_dataset, batch_size=args.valid_batch_size, shuffle=False)

model = Speech2TextCRNN(vocab)
if args.sync_bn:
    model = apex.parallel.convert_syncbn_model(model)
model = model.cuda()

criterion = nn.CTCLoss(blank=0, reduction='sum', zero_infinity=True)
optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()),
                            lr=args.lr, momentum=0.9, weight_decay=args.weight_decay)

if args.mixed_precision:
    model, optimizer = amp.initialize(model, optimizer, opt_level='O2')
if args.distributed:
    model = DistributedDataParallel(model)

start_epoch = 0
global_step = 0
logdir = args.logdir
os.makedirs(logdir, exist_ok=True)


def train(epoch, phase='train'):
    global global_step

    model.train() if phase == 'train' else model.eval()
    torch.set_grad_enabled(True) if phase == 'train' else torch.set_grad_enabled(False)
    data_loader = train_data_loader if phase == 'train' else valid_data_loader

    it = 0
    running_loss = 0.0
    for batch in data_loader:
        inputs, targets, inputs_length, targets_length = batch
        B, n_feature, T = inputs.size()

        outputs = model(inputs.cuda())
        inputs_length = inputs_length // 2
        # BxCxT -> TxBxC
        outputs = outputs.permute(2, 0, 1)

        # nn.CTCLoss wants log softmax with TxBxC
        loss = criterion(outputs.log_softmax(dim=2), targets.cuda(), inputs_length.cuda(), targets_length.cuda())
        loss = loss / B

        if phase == 'train':
            optimizer.zero_grad()

            if args.mixed_precision:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            if args.clip_grad_norm > 0:
                # clip gradient
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.clip_grad_norm)

            optimizer.step()

            # global step size is increased only in the train phase
            global_step += 1
        it += 1

        loss = loss.item()
        running_loss += loss

    epoch_loss = running_loss / it
    if phase == 'valid':
        save_checkpoint(logdir, epoch, global_step, model, optimizer)
    return epoch_loss


since = time.time()
epoch = start_epoch
while True:
    train_epoch_loss = train(epoch, phase='train')
    if args.local_rank == 0:
        print("train epoch loss %f, step=%d, %.0fs" % (train_epoch_loss, global_step, time.time() - since))
        valid_epoch_loss = train(epoch, phase='valid')
        print("valid epoch loss %f" % valid_epoch_loss)

    epoch += 1
    if epoch > args.max_epochs:
        break
