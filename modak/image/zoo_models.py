"""PyTorch definitions of the zoo architectures, written out by hand (no torchvision or transformers).

Imported only when a zoo model is built or exported: importing this module imports torch. Every factory at
the bottom is registered under its name with :func:`factory` (a zoo entry names its factory), takes the per-sample
input shapes (``{input name: shape}``) and the index bounds of its integer inputs (``{input name: table size}``,
the zoo entry's) and returns a freshly initialized module; :mod:`modak.image.zoo` seeds the random generator
around the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

Shapes = Mapping[str, tuple[int, ...]]
Bounds = Mapping[str, int]  # integer input name -> the size of the table it indexes (the zoo entry's index_bounds)


def _init_vision(module: nn.Module) -> None:
    """torchvision's initialization: He-normal (fan-out) convolutions, unit BatchNorm, small linear layers."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def _init_transformer(module: nn.Module) -> None:
    """BERT's and GPT-2's initialization: N(0, 0.02) linear and embedding weights, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0, 0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

class MnistCNN(nn.Module):
    """Two 3x3 conv + ReLU + 2x2 max-pool stages, then two fully connected layers."""

    def __init__(self, channels: int, height: int, width: int, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (height // 4) * (width // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class MLP(nn.Module):
    """Three fully connected layers with ReLU in between."""

    def __init__(self, features: int, hidden: int = 1024, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class LayerChain(nn.Module):
    """``layers`` tiny fully connected layers with tanh (two graph nodes each): a step that is all dispatch
    overhead, the probe of the recipes' overhead priors (``benchmarks/tools/overhead.py``)."""

    def __init__(self, features: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(module for _ in range(layers) for module in (nn.Linear(features, features),
                                                                                     nn.Tanh())))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


# --- ResNet (torchvision layout; ResNet-50 is v1.5: the stride sits on the 3x3 convolution) ---------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock | Bottleneck], layers: list[int], channels: int = 3,
                 classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(block, 64, layers[0], 1)
        self.layer2 = self._layer(block, 128, layers[1], 2)
        self.layer3 = self._layer(block, 256, layers[2], 2)
        self.layer4 = self._layer(block, 512, layers[3], 2)
        self.fc = nn.Linear(512 * block.expansion, classes)
        _init_vision(self)

    def _layer(self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk's last feature map (stride 32), before pooling and the classifier."""
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --- MobileNetV2 (width 1.0, torchvision layout) ----------------------------------------------------------

def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn_act(inp: int, oup: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 activation: type[nn.Module] = nn.ReLU6) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inp, oup, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(oup), activation())


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int,
                 activation: type[nn.Module] = nn.ReLU6) -> None:
        super().__init__()
        hidden = round(inp * expand_ratio)
        self.use_residual = stride == 1 and inp == oup
        layers: list[nn.Module] = [_conv_bn_act(inp, hidden, 1, activation=activation)] if expand_ratio != 1 else []
        layers += [_conv_bn_act(hidden, hidden, 3, stride, groups=hidden, activation=activation),
                   nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # expansion t, channels c, repeats n, first stride s

    def __init__(self, channels: int = 3, classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        inp = _make_divisible(32 * width)
        self.last_channel = _make_divisible(1280 * max(1.0, width))
        features: list[nn.Module] = [_conv_bn_act(channels, inp, stride=2)]
        for t, c, n, s in self.SETTINGS:
            oup = _make_divisible(c * width)
            for i in range(n):
                features.append(InvertedResidual(inp, oup, s if i == 0 else 1, t))
                inp = oup
        features.append(_conv_bn_act(inp, self.last_channel, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Linear(self.last_channel, classes)  # no dropout: training steps must be deterministic
        _init_vision(self)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --- BERT-base encoder with an explicit attention (MatMul + Softmax in the graph) -------------------------

class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, seq: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.seq = heads, hidden // heads, seq
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, self.seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self._split_heads(layer(x)) for layer in (self.query, self.key, self.value))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(-1, self.seq, self.heads * self.head_dim)
        x = self.attention_norm(self.attention_output(context) + x)
        return self.output_norm(self.output(F.gelu(self.intermediate(x))) + x)


class BertClassifier(nn.Module):
    """BERT-base: embeddings, 12 encoder layers, the [CLS] pooler and a 2-class head (no attention mask)."""

    def __init__(self, seq: int, vocab: int, hidden: int = 768, layers: int = 12, heads: int = 12,
                 ffn: int = 3072, max_positions: int = 512, classes: int = 2) -> None:
        super().__init__()
        if seq > max_positions:
            raise ValueError(f"sequence length {seq} exceeds BERT's {max_positions} positions")
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn, seq) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)
        _init_transformer(self)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Positions count along the sequence, derived from the ids so that the whole table stays a weight.
        positions = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
        token_types = torch.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_types))
        x = self.embedding_norm(x)
        for layer in self.layers:
            x = layer(x)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


# --- ViT-Tiny: 16x16 patches, a class token, 12 pre-norm encoder layers (hidden 192, 3 heads) -----------------

class VitLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, tokens: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.tokens = heads, hidden // heads, tokens
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.projection = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.attention_norm(x)).reshape(-1, self.tokens, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)
        x = x + self.projection(context.reshape(-1, self.tokens, self.heads * self.head_dim))
        return x + self.mlp(self.mlp_norm(x))


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al.): a patch-embedding convolution, a class token, learned positions, encoder layers,
    the class token's head."""

    def __init__(self, channels: int, height: int, width: int, patch: int = 16, hidden: int = 192, layers: int = 12,
                 heads: int = 3, ffn: int = 768, classes: int = 1000) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(channels, hidden, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
        tokens = (height // patch) * (width // patch) + 1
        self.positions = nn.Parameter(torch.randn(1, tokens, hidden) * 0.02)
        self.layers = nn.Sequential(*(VitLayer(hidden, heads, ffn, tokens) for _ in range(layers)))
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(x).flatten(2).transpose(1, 2)
        # The class token is broadcast by an add, not an Expand, whose batch-dependent shape ONNX cannot infer.
        x = torch.cat((torch.zeros_like(x[:, :1]) + self.class_token, x), 1) + self.positions
        return self.head(self.norm(self.layers(x))[:, 0])


# --- A small YOLO-style detector (YOLOv5n-sized: CSP backbone, SPPF, PAN neck, 3-scale head) --------------

class ConvBnSiLU(nn.Module):
    def __init__(self, inp: int, oup: int, kernel: int = 1, stride: int = 1, padding: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(inp, oup, kernel, stride, kernel // 2 if padding is None else padding, bias=False)
        self.bn = nn.BatchNorm2d(oup, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.bn(self.conv(x)))


class CspBottleneck(nn.Module):
    def __init__(self, channels: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1 = ConvBnSiLU(channels, channels, 1)
        self.cv2 = ConvBnSiLU(channels, channels, 3)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.shortcut else y


class C3(nn.Module):
    """Cross-stage partial block: half the channels go through the bottlenecks, half bypass them."""

    def __init__(self, inp: int, oup: int, blocks: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        hidden = oup // 2
        self.cv1 = ConvBnSiLU(inp, hidden)
        self.cv2 = ConvBnSiLU(inp, hidden)
        self.cv3 = ConvBnSiLU(2 * hidden, oup)
        self.m = nn.Sequential(*(CspBottleneck(hidden, shortcut) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    def __init__(self, inp: int, oup: int, kernel: int = 5) -> None:
        super().__init__()
        hidden = inp // 2
        self.cv1 = ConvBnSiLU(inp, hidden)
        self.cv2 = ConvBnSiLU(hidden * 4, oup)
        self.pool = nn.MaxPool2d(kernel, 1, kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat((x, y1, y2, self.pool(y2)), 1))


class YoloSmall(nn.Module):
    """Outputs ``(batch, boxes, 5 + classes)`` sigmoid scores over 3 anchors x 3 scales (strides 8/16/32);
    box decoding and non-maximum suppression are post-processing."""

    def __init__(self, channels: int = 3, classes: int = 80, anchors: int = 3) -> None:
        super().__init__()
        self.anchors, self.outputs = anchors, classes + 5
        self.stem = nn.Sequential(ConvBnSiLU(channels, 16, 6, 2, 2), ConvBnSiLU(16, 32, 3, 2), C3(32, 32, 1))
        self.p3 = nn.Sequential(ConvBnSiLU(32, 64, 3, 2), C3(64, 64, 2))
        self.p4 = nn.Sequential(ConvBnSiLU(64, 128, 3, 2), C3(128, 128, 3))
        self.p5 = nn.Sequential(ConvBnSiLU(128, 256, 3, 2), C3(256, 256, 1), SPPF(256, 256))
        self.lateral5 = ConvBnSiLU(256, 128)
        self.top_down4 = C3(256, 128, 1, False)
        self.lateral4 = ConvBnSiLU(128, 64)
        self.top_down3 = C3(128, 64, 1, False)
        self.down3 = ConvBnSiLU(64, 64, 3, 2)
        self.bottom_up4 = C3(128, 128, 1, False)
        self.down4 = ConvBnSiLU(128, 128, 3, 2)
        self.bottom_up5 = C3(256, 256, 1, False)
        self.detect = nn.ModuleList(nn.Conv2d(c, anchors * self.outputs, 1) for c in (64, 128, 256))
        _init_vision(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c3 = self.p3(self.stem(x))
        c4 = self.p4(c3)
        l5 = self.lateral5(self.p5(c4))
        l4 = self.lateral4(self.top_down4(torch.cat((F.interpolate(l5, scale_factor=2.0), c4), 1)))
        n3 = self.top_down3(torch.cat((F.interpolate(l4, scale_factor=2.0), c3), 1))
        n4 = self.bottom_up4(torch.cat((self.down3(n3), l4), 1))
        n5 = self.bottom_up5(torch.cat((self.down4(n4), l5), 1))
        heads = []
        for conv, feature in zip(self.detect, (n3, n4, n5)):
            p = conv(feature).flatten(2).transpose(1, 2)  # (batch, cells, anchors * outputs)
            heads.append(p.reshape(-1, p.shape[1] * self.anchors, self.outputs))
        return torch.sigmoid(torch.cat(heads, 1))


# --- DLRM (small): bottom MLP, one embedding table per sparse feature, dot interaction, top MLP ----------

def _mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (inp, oup) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(inp, oup))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    pairs: torch.Tensor  # a buffer: the indexes of the interactions below the diagonal

    def __init__(self, dense: int, tables: int, rows: int, dim: int = 64) -> None:
        super().__init__()
        self.bottom = _mlp([dense, 512, 256, dim], last_relu=True)
        embeddings = [nn.Embedding(rows, dim) for _ in range(tables)]
        self.embeddings = nn.ModuleList(embeddings)
        features = tables + 1
        lower = [i * features + j for i in range(features) for j in range(i)]  # pairs below the diagonal
        self.register_buffer("pairs", torch.tensor(lower, dtype=torch.int64), persistent=False)
        self.top = _mlp([dim + len(lower), 512, 256, 1], last_relu=False)
        for table in embeddings:
            nn.init.uniform_(table.weight, -1 / math.sqrt(rows), 1 / math.sqrt(rows))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        features = torch.stack([x] + [table(sparse[:, i]) for i, table in enumerate(self.embeddings)], 1)
        interactions = torch.bmm(features, features.transpose(1, 2)).flatten(1)
        return self.top(torch.cat((x, interactions.index_select(1, self.pairs)), 1))


# --- NCF (NeuMF, He et al. 2017): a GMF and an MLP tower over user and item embeddings ------------------------

class NeuMF(nn.Module):
    def __init__(self, users: int, items: int, dim: int = 32, layers: tuple[int, ...] = (128, 64, 32)) -> None:
        super().__init__()
        self.gmf_user, self.gmf_item = nn.Embedding(users, dim), nn.Embedding(items, dim)
        self.mlp_user, self.mlp_item = nn.Embedding(users, layers[0] // 2), nn.Embedding(items, layers[0] // 2)
        self.tower = _mlp(list(layers), last_relu=True)
        self.predict = nn.Linear(dim + layers[-1], 1)
        for table in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(table.weight, 0, 0.01)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        user, item = user[:, 0], item[:, 0]
        gmf = self.gmf_user(user) * self.gmf_item(item)
        mlp = self.tower(torch.cat((self.mlp_user(user), self.mlp_item(item)), 1))
        return torch.sigmoid(self.predict(torch.cat((gmf, mlp), 1)))


# --- ConvNeXt-Atto: a modern CNN (7x7 depthwise convolutions, LayerNorm, GELU, inverted bottlenecks) -------

class ChannelsFirstNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.expand = nn.Linear(dim, 4 * dim)
        self.project = nn.Linear(4 * dim, dim)
        self.scale = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.depthwise(x).permute(0, 2, 3, 1))
        y = self.project(F.gelu(self.expand(y))) * self.scale
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt (Liu et al. 2022): a 4x4 patch stem, four stages of blocks with downsampling between them, a
    pooled, normalized head."""

    def __init__(self, channels: int, dims: tuple[int, ...] = (40, 80, 160, 320),
                 depths: tuple[int, ...] = (2, 2, 6, 2), classes: int = 1000) -> None:
        super().__init__()
        stages: list[nn.Module] = [nn.Conv2d(channels, dims[0], 4, 4), ChannelsFirstNorm(dims[0])]
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i:
                stages += [ChannelsFirstNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            stages += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean((2, 3))))


# --- A small U-Net: a segmentation encoder-decoder (skip connections, transposed-convolution upsampling) -----

def _double_conv(inp: int, oup: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inp, oup, 3, padding=1, bias=False), nn.BatchNorm2d(oup), nn.ReLU(inplace=True),
                         nn.Conv2d(oup, oup, 3, padding=1, bias=False), nn.BatchNorm2d(oup), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """U-Net (Ronneberger et al. 2015) with BatchNorm: per-pixel class logits at the input's resolution."""

    def __init__(self, channels: int, base: int = 16, levels: int = 4, classes: int = 2) -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(levels + 1)]
        self.down = nn.ModuleList(_double_conv(a, b) for a, b in zip([channels, *widths[:-2]], widths[:-1]))
        self.bottom = _double_conv(widths[-2], widths[-1])
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, 2) for a, b in zip(widths[:-1], widths[1:]))
        self.merge = nn.ModuleList(_double_conv(2 * a, a) for a in widths[:-1])
        self.head = nn.Conv2d(base, classes, 1)
        _init_vision(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, merge, skip in zip(reversed(self.up), reversed(self.merge), reversed(skips)):
            x = merge(torch.cat((up(x), skip), 1))
        return self.head(x)


# --- An LSTM language model: embeddings, stacked LSTM layers, the last position's next-token logits ---------

class LstmLanguageModel(nn.Module):
    def __init__(self, vocab: int, embedding: int = 256, hidden: int = 512, layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(self.embedding(input_ids))
        return self.head(output[:, -1])


# --- EfficientNet-B0: inverted bottlenecks with squeeze-and-excitation, SiLU, 3x3 and 5x5 depthwise ----------

class SqueezeExcite(nn.Module):
    """Channel attention: a pooled 1x1 bottleneck whose sigmoid scales the channels."""

    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True)))))


class MBConv(nn.Module):
    def __init__(self, inp: int, oup: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        hidden = inp * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(inp, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()]
        layers += [nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.SiLU(), SqueezeExcite(hidden, max(1, inp // 4)),
                   nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and inp == oup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class EfficientNet(nn.Module):
    """EfficientNet-B0 (Tan and Le 2019), without dropout and stochastic depth (inference form)."""

    # (expansion, output channels, blocks, first stride, kernel) per stage
    STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
              (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))

    def __init__(self, channels: int, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(channels, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
        inp = 32
        for expand, oup, blocks, stride, kernel in self.STAGES:
            for i in range(blocks):
                layers.append(MBConv(inp, oup, expand, kernel, stride if i == 0 else 1))
                inp = oup
        layers += [nn.Conv2d(inp, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)
        _init_vision(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


# --- SqueezeNet 1.1: fire modules (1x1 squeeze, concatenated 1x1 and 3x3 expands), no fully connected layer ---

class Fire(nn.Module):
    def __init__(self, inp: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(inp, squeeze, 1)
        self.expand1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat((F.relu(self.expand1(x)), F.relu(self.expand3(x))), 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1 (Iandola et al. 2016), without dropout: class scores from a 1x1 convolution, averaged."""

    def __init__(self, channels: int, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 64, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256))
        self.classifier = nn.Conv2d(512, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.classifier(self.features(x))).mean((2, 3))


# --- A GRU keyword spotter: stacked GRU layers over frames of audio features, the last frame's class logits ----

class GruClassifier(nn.Module):
    def __init__(self, features: int, hidden: int = 256, layers: int = 2, classes: int = 12) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        output, _ = self.gru(features)
        return self.head(output[:, -1])


# --- A small GPT-style decoder: causal self-attention, pre-norm blocks, the last position's next-token logits --

class GptBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads, self.seq, self.hidden = heads, seq, hidden  # constant shapes: the export infers them
        self.attention_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.projection = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.expand = nn.Linear(hidden, 4 * hidden)
        self.contract = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        seq, hidden = self.seq, self.hidden
        q, k, v = self.qkv(self.attention_norm(x)).reshape(-1, seq, 3, self.heads, hidden // self.heads).permute(
            2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hidden // self.heads) + causal
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(-1, seq, hidden)
        x = x + self.projection(context)
        return x + self.contract(F.gelu(self.expand(self.mlp_norm(x))))


class GptDecoder(nn.Module):
    """A GPT-2-style decoder (Radford et al. 2019): token and learned position embeddings, pre-norm blocks with a
    causal mask (an additive constant), a final norm and an output layer tied to the token embeddings."""

    def __init__(self, seq: int, vocab: int, hidden: int = 256, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.randn(seq, hidden) * 0.01)
        self.blocks = nn.ModuleList(GptBlock(hidden, heads, seq) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.register_buffer("causal", torch.full((seq, seq), -1e9).triu(1))
        _init_transformer(self)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions
        for block in self.blocks:
            x = block(x, self.causal)
        return torch.matmul(self.norm(x[:, -1]), self.tokens.weight.t())


# --- M5: a 1-D CNN over raw audio (a wide strided first convolution, then 3-wide ones, each pooled by 4) -------

class M5(nn.Module):
    """M5 (Dai et al. 2017): four Conv1d + BatchNorm + ReLU + max-pool stages, global average, class logits."""

    WIDTHS = (128, 128, 256, 512)

    def __init__(self, channels: int, classes: int = 35) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (inp, oup) in enumerate(zip((channels, *self.WIDTHS[:-1]), self.WIDTHS)):
            layers += [nn.Conv1d(inp, oup, 80 if i == 0 else 3, 4 if i == 0 else 1), nn.BatchNorm1d(oup), nn.ReLU(),
                       nn.MaxPool1d(4)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(self.WIDTHS[-1], classes)

    @staticmethod
    def output_length(samples: int) -> int:
        """The time steps left after the four stages for an input of ``samples``."""
        length = (samples - 80) // 4 + 1
        for _ in M5.WIDTHS[1:]:
            length = length // 4 - 2
        return length // 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(2))


# --- DETR with a ResNet-18 trunk: a transformer encoder over the stride-32 feature map, object queries --------

class CrossAttentionLayer(nn.Module):
    """A pre-norm decoder layer: self-attention among the queries with its GELU feed-forward (a ViT layer), then
    attention from the queries to the encoder's memory (DETR's own layer puts the feed-forward last)."""

    def __init__(self, hidden: int, heads: int, ffn: int, queries: int, memory: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.queries, self.memory = heads, hidden // heads, queries, memory
        self.self_attention = VitLayer(hidden, heads, ffn, queries)
        self.query_norm = nn.LayerNorm(hidden)
        self.query = nn.Linear(hidden, hidden)
        self.key_value = nn.Linear(hidden, 2 * hidden)
        self.projection = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.self_attention(x)
        q = self.query(self.query_norm(x)).reshape(-1, self.queries, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.key_value(memory).reshape(-1, self.memory, 2, self.heads, self.head_dim).permute(
            2, 0, 3, 1, 4).unbind(0)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)
        return x + self.projection(context.reshape(-1, self.queries, self.heads * self.head_dim))


class Detr(nn.Module):
    """DETR (Carion et al. 2020) with a ResNet-18 trunk and pre-norm layers: a 1x1 projection of the stride-32
    features, learned positions, encoder layers, object queries decoded against the memory, class logits (with
    the no-object class) and sigmoid boxes from a 3-layer MLP, concatenated per query."""

    def __init__(self, channels: int, height: int, width: int, hidden: int = 256, heads: int = 8, ffn: int = 1024,
                 encoders: int = 2, decoders: int = 2, queries: int = 50, classes: int = 91) -> None:
        super().__init__()
        self.backbone = ResNet(BasicBlock, [2, 2, 2, 2], channels)
        tokens = (height // 32) * (width // 32)
        self.projection = nn.Conv2d(512, hidden, 1)
        self.positions = nn.Parameter(torch.randn(1, tokens, hidden) * 0.02)
        self.encoder = nn.Sequential(*(VitLayer(hidden, heads, ffn, tokens) for _ in range(encoders)))
        self.queries = nn.Parameter(torch.randn(1, queries, hidden) * 0.02)
        self.decoder = nn.ModuleList(CrossAttentionLayer(hidden, heads, ffn, queries, tokens)
                                     for _ in range(decoders))
        self.norm = nn.LayerNorm(hidden)
        self.classes = nn.Linear(hidden, classes + 1)
        self.boxes = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                   nn.Linear(hidden, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.projection(self.backbone.features(x)).flatten(2).transpose(1, 2) + self.positions)
        # The queries are broadcast by an add (as ViT's class token), not an Expand of a batch-dependent shape.
        queries = torch.zeros_like(memory[:, :1]) + self.queries
        for layer in self.decoder:
            queries = layer(queries, memory)
        queries = self.norm(queries)
        return torch.cat((self.classes(queries), torch.sigmoid(self.boxes(queries))), 2)


# --- MobileViT-XXS: inverted residuals (SiLU) and MobileViT blocks (transformers over 2x2-unfolded patches) ---

class MobileVitBlock(nn.Module):
    """Local 3x3 then 1x1 convolutions, ``layers`` transformer layers across the pixels at the same place of each
    2x2 patch, a 1x1 convolution back, and a 3x3 fusion with the block's input."""

    def __init__(self, channels: int, dim: int, layers: int, height: int, width: int, heads: int = 4) -> None:
        super().__init__()
        self.dim, self.height, self.width = dim, height, width
        self.local = nn.Sequential(_conv_bn_act(channels, channels, 3, activation=nn.SiLU),
                                   nn.Conv2d(channels, dim, 1, bias=False))
        tokens = (height // 2) * (width // 2)
        self.transformer = nn.Sequential(*(VitLayer(dim, heads, 2 * dim, tokens) for _ in range(layers)),
                                         nn.LayerNorm(dim))
        self.back = _conv_bn_act(dim, channels, 1, activation=nn.SiLU)
        self.fuse = _conv_bn_act(2 * channels, channels, 3, activation=nn.SiLU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d, h, w = self.dim, self.height // 2, self.width // 2
        y = self.local(x).reshape(-1, d, h, 2, w, 2).permute(0, 3, 5, 2, 4, 1).reshape(-1, h * w, d)
        y = self.transformer(y).reshape(-1, 2, 2, h, w, d).permute(0, 5, 3, 1, 4, 2).reshape(-1, d, 2 * h, 2 * w)
        return self.fuse(torch.cat((x, self.back(y)), 1))


class MobileVit(nn.Module):
    """MobileViT-XXS (Mehta & Rastegari 2022): a stride-2 stem, inverted residuals of expansion 2, three MobileViT
    blocks (widths 64, 80, 96; 2, 4 and 3 layers) at strides 8, 16 and 32, a 1x1 expansion to 320, class logits."""

    def __init__(self, channels: int, height: int, width: int, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(channels, 16, 3, 2, activation=nn.SiLU),
                                   InvertedResidual(16, 16, 1, 2, nn.SiLU)]
        layers += [InvertedResidual(a, 24, s, 2, nn.SiLU) for a, s in ((16, 2), (24, 1), (24, 1))]
        inp = 24
        for stride, (oup, dim, depth) in zip((8, 16, 32), ((48, 64, 2), (64, 80, 4), (80, 96, 3))):
            layers += [InvertedResidual(inp, oup, 2, 2, nn.SiLU),
                       MobileVitBlock(oup, dim, depth, height // stride, width // stride)]
            inp = oup
        layers.append(_conv_bn_act(inp, 320, 1, activation=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(320, classes)
        _init_vision(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


# --- DeepSpeech2-small: 2-D convolutions over a spectrogram with clipped ReLU, bidirectional LSTMs -----------

class DeepSpeech(nn.Module):
    """DeepSpeech 2 (Amodei et al. 2016), small: two strided 2-D convolutions (41x11 and 21x11) with BatchNorm and
    a ReLU clipped at 20 (Hardtanh), 3 bidirectional LSTM layers of 256, per-frame logits of 29 characters."""

    def __init__(self, frequencies: int, hidden: int = 256, layers: int = 3, characters: int = 29) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5), bias=False), nn.BatchNorm2d(32),
                                  nn.Hardtanh(0, 20),
                                  nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5), bias=False), nn.BatchNorm2d(32),
                                  nn.Hardtanh(0, 20))
        features = 32 * (((frequencies + 1) // 2 + 1) // 2)  # 32 channels of the frequencies left
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, characters)
        _init_vision(self)

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        x = self.conv(spectrogram)  # batch, channels, frequencies, frames
        output, _ = self.lstm(x.flatten(1, 2).transpose(1, 2))
        return self.head(output)


# --- A CRNN sound-event detector: 2-D convolutions pooled over frequency, bidirectional GRUs, per-frame events ---

class SoundEventCrnn(nn.Module):
    """CRNN (Cakir et al. 2017): three 3x3 Conv + BatchNorm + ReLU blocks max-pooled over frequency only (by 4, 4
    and 2), 2 bidirectional GRU layers of 128 over the frames, per-frame sigmoid activities of 10 event classes."""

    POOLS = (4, 4, 2)

    def __init__(self, mels: int, width: int = 64, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        for i, pool in enumerate(self.POOLS):
            blocks += [nn.Conv2d(1 if i == 0 else width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(), nn.MaxPool2d((pool, 1))]
        self.conv = nn.Sequential(*blocks)
        self.gru = nn.GRU(width * (mels // math.prod(self.POOLS)), hidden, 2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)
        _init_vision(self)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.conv(mel)  # batch, channels, mel bands left, frames
        output, _ = self.gru(x.flatten(1, 2).transpose(1, 2))
        return torch.sigmoid(self.head(output))


# --- Factories: per-sample input shapes in, module out -----------------------------------------------------

Factory = Callable[[Shapes, Bounds], nn.Module]
_FACTORIES: dict[str, Factory] = {}
FACTORIES: Mapping[str, Factory] = MappingProxyType(_FACTORIES)  # name -> factory, as registered by @factory


def factory(function: Factory) -> Factory:
    """Register ``function`` as the factory of its name, which zoo entries give as their ``factory``."""
    if function.__name__ in _FACTORIES:
        raise ValueError(f"two zoo factories are named {function.__name__}")
    _FACTORIES[function.__name__] = function
    return function


def build(name: str, shapes: Shapes, bounds: Bounds) -> nn.Module:
    """The module made by the factory registered as ``name`` for per-sample input ``shapes`` and the zoo entry's
    index ``bounds`` (the sizes of the tables its integer inputs index), its constant tensors made distinct.

    Floating-point parameters and buffers whose elements are all equal (norm scales and shifts, zero biases,
    running statistics) get small positive noise, |N(0, 0.02)|, positive to keep variances valid: the exporter
    merges equal initializers into one, which would hide parameters, and identity normalizations would let an
    ONNX Runtime comparison miss them.
    """
    model = FACTORIES[name](shapes, bounds)
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point() and tensor.numel() > 1 and bool((tensor == tensor.flatten()[0]).all()):
                tensor.add_(torch.randn_like(tensor).abs() * 0.02)
    return model


@factory
def mnist_cnn(shapes: Shapes, bounds: Bounds) -> nn.Module:
    channels, height, width = shapes["input"]
    if height < 4 or width < 4:
        raise ValueError(f"height and width must be at least 4 (two 2x2 poolings), got {height}x{width}")
    return MnistCNN(channels, height, width)


@factory
def mlp(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return MLP(shapes["input"][0])


@factory
def resnet18(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2], channels=shapes["input"][0])


@factory
def mlp_large(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return MLP(shapes["input"][0], hidden=4096)


@factory
def resnet34(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return ResNet(BasicBlock, [3, 4, 6, 3], channels=shapes["input"][0])


@factory
def resnet50(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3], channels=shapes["input"][0])


@factory
def mobilenet_v2(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return MobileNetV2(channels=shapes["input"][0])


@factory
def bert_base(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return BertClassifier(seq=shapes["input_ids"][0], vocab=bounds["input_ids"])


@factory
def bert_small(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return BertClassifier(seq=shapes["input_ids"][0], vocab=bounds["input_ids"], hidden=512, layers=4,
                          heads=8, ffn=2048)


def _image(shapes: Shapes, multiple: int, why: str) -> tuple[int, int, int]:
    """The (channels, height, width) of the image input, whose height and width ``why`` needs in ``multiple``s."""
    channels, height, width = shapes["input"]
    if height % multiple or width % multiple:
        raise ValueError(f"height and width must be multiples of {multiple} ({why}), got {height}x{width}")
    return channels, height, width


@factory
def vit_tiny(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return VisionTransformer(*_image(shapes, 16, "the patch size"))


@factory
def yolo_small(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return YoloSmall(_image(shapes, 32, "the coarsest stride")[0])


@factory
def dlrm_small(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return DLRM(dense=shapes["dense"][0], tables=shapes["sparse"][0], rows=bounds["sparse"])


@factory
def ncf(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return NeuMF(users=bounds["user"], items=bounds["item"])


@factory
def chain4(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return LayerChain(shapes["input"][0], layers=4)


@factory
def chain64(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return LayerChain(shapes["input"][0], layers=64)


@factory
def convnext_atto(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return ConvNeXt(_image(shapes, 32, "the stem and three downsamplings")[0])


@factory
def unet_small(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return UNet(_image(shapes, 16, "four poolings")[0])


@factory
def lstm_lm(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return LstmLanguageModel(vocab=bounds["input_ids"])


@factory
def efficientnet_b0(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return EfficientNet(_image(shapes, 32, "five stride-2 stages")[0])


@factory
def squeezenet(shapes: Shapes, bounds: Bounds) -> nn.Module:
    channels, height, width = shapes["input"]
    if min(height, width) < 17:
        raise ValueError(f"height and width must be at least 17 (a stride-2 convolution and three poolings), "
                         f"got {height}x{width}")
    return SqueezeNet(channels)


@factory
def gru_kws(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return GruClassifier(features=shapes["features"][1])


@factory
def gpt_small(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return GptDecoder(seq=shapes["input_ids"][0], vocab=bounds["input_ids"])


@factory
def m5_audio(shapes: Shapes, bounds: Bounds) -> nn.Module:
    channels, samples = shapes["audio"]
    if M5.output_length(samples) < 1:
        raise ValueError(f"the audio needs at least 1772 samples (a stride-4 convolution and four poolings by 4), "
                         f"got {samples}")
    return M5(channels)


@factory
def detr_r18(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return Detr(*_image(shapes, 32, "the trunk's stride"))


@factory
def mobilevit_xxs(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return MobileVit(*_image(shapes, 64, "2x2 patches at stride 32"))


@factory
def deepspeech_small(shapes: Shapes, bounds: Bounds) -> nn.Module:
    return DeepSpeech(frequencies=shapes["spectrogram"][1])


@factory
def crnn_sed(shapes: Shapes, bounds: Bounds) -> nn.Module:
    mels = shapes["mel"][1]
    if mels % math.prod(SoundEventCrnn.POOLS):
        raise ValueError(f"the mel bands must be a multiple of {math.prod(SoundEventCrnn.POOLS)} (pooled by 4, 4 "
                         f"and 2), got {mels}")
    return SoundEventCrnn(mels)
