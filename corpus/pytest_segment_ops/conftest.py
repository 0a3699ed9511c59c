import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="device the tests run on")


@pytest.fixture
def device(request):
    return torch.device(request.config.getoption("--device"))
