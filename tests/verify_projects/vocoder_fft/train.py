"""A tiny vocoder trained with float16 autocast: its spectral loss takes FFTs of the generator's
output, and FFTs have no bfloat16 kernel (issue 16).

    python train.py
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=256, frames=16, hop=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mel = torch.randn(n, 8, frames, generator=gen)
    t = torch.arange(frames * hop, dtype=torch.float32)
    wav = torch.sin(t[None, :] * (0.05 + 0.2 * torch.rand(n, 1, generator=gen)))
    return TensorDataset(mel, wav)


def spectral_loss(wav_hat, wav, n_fft=64):
    # Magnitude spectra of overlapping frames (an STFT with a rectangular window).
    spec_hat = torch.fft.rfft(wav_hat.unfold(-1, n_fft, n_fft // 2)).abs()
    spec = torch.fft.rfft(wav.unfold(-1, n_fft, n_fft // 2)).abs()
    return (spec_hat - spec).abs().mean()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.nn.Sequential(
        torch.nn.Conv1d(8, 32, 3, padding=1), torch.nn.Tanh(), torch.nn.ConvTranspose1d(32, 1, 16, stride=16)
    ).to(device)
    optimizer = torch.optim.Adam(generator.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler(device)
    loader = DataLoader(make_data(), batch_size=8, shuffle=True)
    for epoch in range(20):
        for mel, wav in loader:
            mel, wav = mel.to(device), wav.to(device)
            with torch.autocast(device_type=device, dtype=torch.float16):
                wav_hat = generator(mel).squeeze(1)
            loss = spectral_loss(wav_hat, wav)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
