"""The benchmark zoo: small networks of shapes nobody tuned Shoal for, as a
user exports them from PyTorch. Each takes Fashion-MNIST's [N, 1, 28, 28]
(the recurrent and 1-D nets read it as 28 steps of 28 features, the 3-D
net as 4 frames of 7 rows) or, for
torchvision's image nets, [N, 3, 32, 32]. Random init, no downloads.
"""
import torch
import torch.nn as nn


class LeNet(nn.Module):
    """LeNet-5 as in 1998: tanh and average pooling."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Tanh(), nn.AvgPool2d(2),
                               nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2), nn.Flatten(),
                               nn.Linear(400, 120), nn.Tanh(), nn.Linear(120, 84), nn.Tanh(),
                               nn.Linear(84, 10))

    def forward(self, x):
        return self.f(x)


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, tok_hidden, ch_hidden):
        super().__init__()
        self.n1 = nn.LayerNorm(dim)
        self.tok = nn.Sequential(nn.Linear(tokens, tok_hidden), nn.GELU(),
                                 nn.Linear(tok_hidden, tokens))
        self.n2 = nn.LayerNorm(dim)
        self.ch = nn.Sequential(nn.Linear(dim, ch_hidden), nn.GELU(), nn.Linear(ch_hidden, dim))

    def forward(self, x):
        x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.n2(x))


class Mixer(nn.Module):
    """MLP-Mixer over 4x4 patches of a 28x28 image (49 tokens)."""

    def __init__(self, dim=64, depth=4):
        super().__init__()
        self.stem = nn.Conv2d(1, dim, 4, stride=4)
        self.blocks = nn.Sequential(*[MixerBlock(49, dim, 64, 128) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        h = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(h)).mean(1))


class Conv1dNet(nn.Module):
    """An audio-style 1-D net: the 28 rows are 28 channels over 28 steps."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv1d(28, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU(),
                               nn.MaxPool1d(2), nn.Conv1d(64, 128, 3, padding=1),
                               nn.BatchNorm1d(128), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                               nn.Flatten(), nn.Linear(128, 10))

    def forward(self, x):
        return self.f(x.reshape(x.shape[0], 28, 28))


class Conv3dNet(nn.Module):
    """A video-style 3-D net: the image's 28 rows as 4 frames of 7 rows; a
    strided, a padded and a dilated grouped 3-D convolution."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv3d(1, 8, 3, padding=1), nn.ReLU(),
                               nn.Conv3d(8, 16, (2, 3, 3), stride=2, padding=(0, 1, 1)),
                               nn.ReLU(),
                               nn.Conv3d(16, 16, 3, padding=2, dilation=2, groups=4), nn.ReLU(),
                               nn.Flatten(), nn.Linear(16 * 2 * 4 * 14, 10))

    def forward(self, x):
        return self.f(x.reshape(x.shape[0], 1, 4, 7, 28))


class ConvT3dNet(nn.Module):
    """A 3-D encoder-decoder: a strided Conv3d down, then two ConvTranspose3d
    up (strided with padding, output_padding and groups; strided in H and W
    with a dilated depth)."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv3d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
                               nn.ConvTranspose3d(8, 8, 3, stride=2, padding=1, output_padding=1,
                                                  groups=2), nn.ReLU(),
                               nn.ConvTranspose3d(8, 2, (3, 2, 2), stride=(1, 2, 2),
                                                  dilation=(2, 1, 1)), nn.ReLU(),
                               nn.Flatten(), nn.Linear(2 * 8 * 16 * 56, 10))

    def forward(self, x):
        return self.f(x.reshape(x.shape[0], 1, 4, 7, 28))


class Pool3dNet(nn.Module):
    """3-D pooling after a 3-D convolution: a max pool with padding and
    ceil_mode, an average pool with padding left out of the count."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv3d(1, 8, 3, padding=1), nn.ReLU(),
                               nn.MaxPool3d((2, 3, 3), stride=(1, 2, 2), padding=1,
                                            ceil_mode=True),
                               nn.AvgPool3d(2, stride=2, padding=(1, 0, 1),
                                            count_include_pad=False),
                               nn.Flatten(), nn.Linear(8 * 3 * 2 * 8, 10))

    def forward(self, x):
        return self.f(x.reshape(x.shape[0], 1, 4, 7, 28))


class DwSep(nn.Module):
    """Depthwise-separable blocks, MobileNet v1 style, at 28x28."""

    def __init__(self):
        super().__init__()

        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                                 nn.BatchNorm2d(cin), nn.ReLU(),
                                 nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU())
        self.f = nn.Sequential(nn.Conv2d(1, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32),
                               nn.ReLU(), block(32, 64, 2), block(64, 128, 1), block(128, 128, 2),
                               block(128, 256, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                               nn.Linear(256, 10))

    def forward(self, x):
        return self.f(x)


class Recurrent(nn.Module):
    """A GRU or LSTM over the image's 28 rows; the last hidden state classifies."""

    def __init__(self, kind, hidden=128):
        super().__init__()
        self.rnn = (nn.GRU if kind == "gru" else nn.LSTM)(28, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        out, _ = self.rnn(x.reshape(x.shape[0], 28, 28))
        return self.head(out[:, -1])


def vit():
    import torchvision
    net = torchvision.models.vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=10, dropout=0.0, attention_dropout=0.0)
    # torchvision starts the head at zero: every logit 0 and no gradient below
    # it, which would leave an import test comparing zeros.
    nn.init.normal_(net.heads.head.weight, std=0.02)
    return net


# name -> (constructor, input shape at batch 8)
GRAY = (8, 1, 28, 28)
RGB = (4, 3, 32, 32)
MODELS = {
    "lenet": (LeNet, GRAY),
    "mixer": (Mixer, GRAY),
    "conv1d": (Conv1dNet, GRAY),
    "conv3d": (Conv3dNet, GRAY),
    "pool3d": (Pool3dNet, GRAY),
    "convt3d": (ConvT3dNet, GRAY),
    "dwsep": (DwSep, GRAY),
    "gru": (lambda: Recurrent("gru"), GRAY),
    "lstm": (lambda: Recurrent("lstm"), GRAY),
    "vit": (vit, RGB),
}
TORCHVISION = ("mnasnet0_5", "squeezenet1_1", "shufflenet_v2_x0_5", "mobilenet_v3_small")


def build(name):
    if name in MODELS:
        ctor, shape = MODELS[name]
        return ctor(), shape
    if name in TORCHVISION:
        import torchvision
        return getattr(torchvision.models, name)(num_classes=10), RGB
    return None
