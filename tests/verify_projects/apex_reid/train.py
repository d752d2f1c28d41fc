# -*- coding: utf-8 -*-
"""A CPU-sized reduction, written for ampmigrate's tests, of layumi/Person_reID_baseline_pytorch
train_DDP.py: apex imported in `try: ... except ImportError:` beside `apex.optimizers.FusedSGD`
(used only under `--FSGD`), `amp.initialize(model, optimizer_ft, opt_level = "O1")` at module level
under `if fp16:` (from `--fp16`), and a `train_model(...)` with train/val phases, a warm-up that
scales the loss, `with amp.scale_loss(loss, optimizer)` only when fp16, a plain `optimizer.step()`,
a StepLR scheduler and `save_network` checkpoints. The upstream try block also star-imports
`apex.fp16_utils` (unused there); it is left out. The model is a tiny classifier (a conv stem, a
bottleneck and a classifier with their own learning rates) on synthetic 8x8 "person" images.

    python train.py --fp16
"""

from __future__ import print_function, division

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

version = torch.__version__
#fp16
try:
    from apex import amp
    from apex.optimizers import FusedSGD
except ImportError: # will be 3.x series
    print('This is not an error. If you want to use low precision, i.e., fp16, please install the apex with cuda support (https://github.com/NVIDIA/apex) and update pytorch to 1.0')

######################################################################
# Options
# --------
parser = argparse.ArgumentParser(description='Training')
parser.add_argument('--name', default='ft_tiny', type=str, help='output model name')
parser.add_argument('--batchsize', default=32, type=int, help='batchsize')
parser.add_argument('--lr', default=0.05, type=float, help='learning rate')
parser.add_argument('--weight_decay', default=5e-4, type=float, help='Weight decay. More Regularization Smaller Weight.')
parser.add_argument('--total_epoch', default=60, type=int, help='total training epoch')
parser.add_argument('--fp16', action='store_true', help='use float16 instead of float32, which will save about 50%% memory' )
parser.add_argument('--FSGD', action='store_true', help='use fused sgd, which will speed up trainig slightly. apex is needed.' )
parser.add_argument('--droprate', default=0.5, type=float, help='drop rate')
parser.add_argument('--warm_epoch', default=1, type=int, help='the first K epoch that needs warm up')
parser.add_argument('--local_rank', default=0, type=int)
opt = parser.parse_args()

fp16 = opt.fp16
name = opt.name
use_gpu = torch.cuda.is_available()

######################################################################
# Load Data
# ---------
num_classes = 10


def make_split(samples, seed):
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_classes, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, num_classes, (samples,), generator=gen)
    images = prototypes[labels] + 0.8 * torch.randn(samples, 3, 8, 8, generator=gen)
    return TensorDataset(images, labels)


image_datasets = {'train': make_split(640, 1), 'val': make_split(128, 2)}
dataloaders = {x: DataLoader(image_datasets[x], batch_size=opt.batchsize, shuffle=(x == 'train'))
               for x in ['train', 'val']}
dataset_sizes = {x: len(image_datasets[x]) for x in ['train', 'val']}


class ft_net(nn.Module):
    def __init__(self, class_num, droprate=0.5):
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.Dropout(p=droprate),
                                        nn.Linear(32, class_num))

    def forward(self, x):
        return self.classifier(self.model(x))


def save_network(network, dirname, epoch_label, local_rank=-1):
    if isinstance(epoch_label, int):
        save_filename = 'net_%03d.pth' % epoch_label
    else:
        save_filename = 'net_%s.pth' % epoch_label
    save_path = os.path.join('./model', dirname, save_filename)
    if local_rank == 0:
        torch.save(network.state_dict(), save_path)


######################################################################
# Training the model
# ------------------
y_loss = {'train': [], 'val': []}
y_err = {'train': [], 'val': []}


def train_model(model, criterion, optimizer, scheduler, num_epochs=25):
    since = time.time()

    warm_up = 0.1 # We start from the 0.1*lrRate
    warm_iteration = round(dataset_sizes['train']/opt.batchsize)*opt.warm_epoch # first 5 epoch
    for epoch in range(num_epochs):
        print('Epoch {}/{}'.format(epoch, num_epochs - 1))

        # Each epoch has a training and validation phase
        for phase in ['train', 'val']:
            if phase == 'train':
                model.train(True)  # Set model to training mode
            else:
                model.train(False)  # Set model to evaluate mode

            running_loss = 0.0
            running_corrects = 0.0
            # Iterate over data.
            for iter, data in enumerate(dataloaders[phase]):
                # get the inputs
                inputs, labels = data
                now_batch_size, c, h, w = inputs.shape
                if now_batch_size < opt.batchsize: # skip the last batch
                    continue
                if use_gpu:
                    inputs = inputs.cuda(opt.local_rank, non_blocking=True)
                    labels = labels.cuda(opt.local_rank, non_blocking=True)

                # zero the parameter gradients
                optimizer.zero_grad()

                # forward
                if phase == 'val':
                    with torch.no_grad():
                        outputs = model(inputs)
                else:
                    outputs = model(inputs)

                _, preds = torch.max(outputs.data, 1)
                loss = criterion(outputs, labels)

                # backward + optimize only if in training phase
                if epoch<opt.warm_epoch and phase == 'train':
                    warm_up = min(1.0, warm_up + 0.9 / warm_iteration)
                    loss = loss*warm_up

                if phase == 'train':
                    if fp16: # we use optimier to backward loss
                        with amp.scale_loss(loss, optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    optimizer.step()
                # statistics
                running_loss += loss.item() * now_batch_size
                del loss
                running_corrects += float(torch.sum(preds == labels.data))

            epoch_loss = running_loss / dataset_sizes[phase]
            epoch_acc = running_corrects / dataset_sizes[phase]
            print('{} Loss: {:.4f} Acc: {:.4f}'.format(phase, epoch_loss, epoch_acc))

            y_loss[phase].append(epoch_loss)
            y_err[phase].append(1.0-epoch_acc)
            # deep copy the model
            if opt.local_rank == 0 and phase == 'val' and ((epoch+1)%10 == 0 or epoch == num_epochs - 1):
                print('saving...')
                save_network(model, opt.name, epoch+1, opt.local_rank)
            if phase == 'train':
                scheduler.step()

    time_elapsed = time.time() - since
    print('Training complete in {:.0f}m {:.0f}s'.format(time_elapsed // 60, time_elapsed % 60))
    save_network(model, opt.name, 'last', opt.local_rank)
    return model


model = ft_net(num_classes, opt.droprate)
if use_gpu:
    model = model.cuda()

optim_name = optim.SGD #apex.optimizers.FusedSGD
if opt.FSGD: # apex is needed
    optim_name = FusedSGD

ignored_params = list(map(id, model.classifier.parameters()))
base_params = filter(lambda p: id(p) not in ignored_params, model.parameters())
classifier_params = model.classifier.parameters()
optimizer_ft = optim_name([
     {'params': base_params, 'lr': 0.1*opt.lr},
     {'params': classifier_params, 'lr': opt.lr}
 ], weight_decay=opt.weight_decay, momentum=0.9, nesterov=True)

# Decay LR by a factor of 0.1 every 40 epochs
exp_lr_scheduler = optim.lr_scheduler.StepLR(optimizer_ft, step_size=opt.total_epoch*2//3, gamma=0.1)

dir_name = os.path.join('./model', name)
os.makedirs(dir_name, exist_ok=True)

criterion = nn.CrossEntropyLoss()

if fp16:
    #model = network_to_half(model)
    #optimizer_ft = FP16_Optimizer(optimizer_ft, static_loss_scale = 128.0)
    model, optimizer_ft = amp.initialize(model, optimizer_ft, opt_level = "O1")

model = train_model(model, criterion, optimizer_ft, exp_lr_scheduler,
                    num_epochs=opt.total_epoch)
