"""A loop that builds no torch.optim optimizer and updates its weights by hand after each
``backward()`` (as pytorch/examples' regression and word_language_model do): 25
iterations, each clipping its gradients and printing its loss and the norm clipping saw,
then an evaluation under ``no_grad``."""

import torch


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 1)
    data, target = torch.randn(64, 8), torch.randn(64, 1)
    for iteration in range(25):
        loss = torch.nn.functional.mse_loss(model(data), target)
        model.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(parameter.grad, alpha=-0.1)
        print(
            f"iteration {iteration + 1} loss {loss.item():.6f} norm {norm.item():.6f}", flush=True
        )
    with torch.no_grad():
        print(f"eval loss {torch.nn.functional.mse_loss(model(data), target).item():.6f}")


if __name__ == "__main__":
    main()
