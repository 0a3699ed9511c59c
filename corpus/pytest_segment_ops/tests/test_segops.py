import pytest
import torch

from segops import edges_to_nodes, segment_mean, segment_sum


def test_segment_sum_adds_rows(device):
    values = torch.arange(6.0, device=device).view(3, 2)
    out = segment_sum(values, torch.tensor([0, 1, 0], device=device), 2)
    assert out.tolist() == [[4.0, 6.0], [2.0, 3.0]]


def test_segment_mean_of_an_empty_segment_is_zero(device):
    out = segment_mean(torch.ones(2, 3, device=device), torch.tensor([0, 0], device=device), 3)
    assert out[1].abs().sum().item() == 0


def test_out_of_range_ids_raise(device):
    if device.type != "cpu":
        pytest.skip("the CPU kernel checks ids; CUDA asserts")
    with pytest.raises((IndexError, RuntimeError)):
        segment_sum(torch.ones(2), torch.tensor([0, 5]), 2)


def ring(num_nodes, device, extra_node=False):
    src = torch.arange(num_nodes, device=device)
    dst = (src + 1) % num_nodes
    if extra_node:  # a graph whose edge list names a node the count leaves out
        dst = torch.cat([dst, torch.tensor([num_nodes], device=device)])
        src = torch.cat([src, torch.tensor([0], device=device)])
    return torch.stack([src, dst])


@pytest.mark.parametrize("graph", ["ring", "ring_plus_one"])
def test_edges_to_nodes_shape(graph, device):
    num_nodes = 5
    edge_index = ring(num_nodes, device, extra_node=graph == "ring_plus_one")
    messages = torch.randn(edge_index.shape[1], 4, device=device)
    out = edges_to_nodes(edge_index, messages, num_nodes)
    assert out.shape == (num_nodes, 4)


def test_runs_after_the_failure(device):
    assert torch.ones(3, device=device).sum().item() == 3
