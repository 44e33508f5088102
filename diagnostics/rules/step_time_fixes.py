"""step-time-outliers' fix code, one snippet per part of the step that grew (a cause key
of ``step_time_outliers.CAUSE_WORDS``), so the fix follows the cause the finding names."""

FIX_CODE = {
    "data": """\
# before: now and then a batch takes far longer to arrive (a slow read, a worker restart)
loader = DataLoader(dataset, batch_size=32, num_workers=2)

# after: workers stay alive and queue more batches, so a slow read hides behind them
loader = DataLoader(
    dataset, batch_size=32, num_workers=4,
    persistent_workers=True,  # no worker restart at each epoch
    prefetch_factor=4,        # batches each worker keeps ready
)
""",
    "copy": """\
# before: pageable batches are copied synchronously
loader = DataLoader(dataset, batch_size=32, num_workers=4)
batch = batch.to("cuda")

# after: pinned batches copied asynchronously
loader = DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)
batch = batch.to("cuda", non_blocking=True)
""",
    "compute": """\
# before: collector pauses land inside forward and backward now and then, and batches of
# changing shapes make kernels re-tune
model, optimizer = build_model_and_optimizer()
tokens = tokenizer(texts, padding=True)

# after: objects made at set-up are frozen out of the collector's scans, and every batch
# is padded to one shape
import gc

model, optimizer = build_model_and_optimizer()
gc.collect()
gc.freeze()
tokens = tokenizer(texts, padding="max_length", max_length=128, truncation=True)
""",
    "optimizer": """\
# before: one small kernel per parameter, and collector pauses inside the optimiser step
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

# after: one fused update for all parameters, and set-up objects frozen out of the
# collector's scans
import gc

optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
gc.collect()
gc.freeze()
""",
    "unknown": """\
# before: the step records do not say which part of the slow steps grows
for batch in loader:
    train_step(batch)

# after: profile a few steps around a slow one to see which part grows
from torch.profiler import profile, schedule, tensorboard_trace_handler

with profile(schedule=schedule(wait=5, warmup=1, active=10),
             on_trace_ready=tensorboard_trace_handler("traces")) as prof:
    for batch in loader:
        train_step(batch)
        prof.step()
""",
}
