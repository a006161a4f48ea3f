"""Preemption of a multi-process run: SIGTERM to one process stops them all.

Two CPU processes (gloo collectives) train configs/tiny.py with
`python -m linformer_jax.train`, as a pod's hosts would. A scheduler's
preemption notice reaches one host only: here SIGTERM goes to process 1
alone. Every process must then save the same step and exit, and the same two
commands must resume to the losses of a run that was never stopped.
"""

import signal

import pytest
from run_helpers import PORT_ATTEMPTS
from run_helpers import PORT_TAKEN
from run_helpers import free_port
from run_helpers import latest_checkpoint
from run_helpers import losses_by_step
from run_helpers import tiny_flags
from run_helpers import wait_for_step

from linformer_jax import run_folder
from linformer_jax.checkpoints.store import CheckpointStore

# Both processes must be gone this long after the signal: the notice reaches
# process 0 within a second, then one step, one save and the shutdown follow.
EXIT_SECONDS = 60


def start_two_processes(run_python, workdir, log_prefix):
  """Starts the two processes of an endless run of configs/tiny.py in
  `workdir`, logging every step; returns them once process 0 has logged one."""
  for attempt in range(PORT_ATTEMPTS):
    port = free_port()
    logs = [f'{log_prefix}_{attempt}_process_{index}.log' for index in range(2)]
    processes = [
        run_python(
            '-m',
            'linformer_jax.train',
            *tiny_flags(workdir),
            f'--coordinator_address=127.0.0.1:{port}',
            '--num_processes=2',
            f'--process_id={index}',
            '--cpu_collectives=gloo',
            '--config.total_steps=100000',
            '--config.log_every=1',
            '--config.checkpoint_every=100000',
            '--config.eval_every=100000',
            wait=False,
            log=logs[index],
        )
        for index in range(2)
    ]
    try:
      wait_for_step(workdir, 1, processes[0], timeout=240)
      return processes, logs
    except AssertionError:
      with open(logs[0]) as f:
        port_taken = PORT_TAKEN in f.read()
      stop(processes)
      if not port_taken:
        raise
  raise AssertionError(f'{PORT_ATTEMPTS} free ports in a row were taken; see {log_prefix}_*')


def stop(processes):
  for process in processes:
    if process.poll() is None:
      process.kill()
      process.wait()


def preempt_process_1(processes, logs, workdir, after_step):
  """Sends SIGTERM to process 1 alone once the run has logged `after_step`;
  returns the step both saved, checking that both exited with 143 in time."""
  try:
    wait_for_step(workdir, after_step, processes[0])
    processes[1].send_signal(signal.SIGTERM)
    for process, log in zip(processes, logs):
      with open(log) as f:
        assert process.wait(timeout=EXIT_SECONDS) == 128 + signal.SIGTERM, f.read()[-4000:]
  finally:
    stop(processes)
  return latest_checkpoint(workdir)


@pytest.mark.long
@pytest.mark.slow
def test_sigterm_to_one_process_saves_one_step_on_all_and_resumes_exactly(tmp_path, run_python):
  preempted, straight = tmp_path / 'preempted', tmp_path / 'straight'

  processes, logs = start_two_processes(run_python, preempted, tmp_path / 'first')
  saved = preempt_process_1(processes, logs, preempted, after_step=3)
  # One complete checkpoint, of the last step either process took (process 0
  # writes the metrics; process 1 would have crashed a collective otherwise).
  store = CheckpointStore(run_folder.RunFolder(str(preempted)).checkpoints)
  try:
    assert store.all_steps() == [saved]
  finally:
    store.close()
  assert saved >= 3 and max(losses_by_step(preempted)) == saved

  # The same two commands resume, and are preempted again further on.
  processes, logs = start_two_processes(run_python, preempted, tmp_path / 'resumed')
  resumed = preempt_process_1(processes, logs, preempted, after_step=saved + 3)
  assert resumed > saved

  # A run never stopped before `resumed` takes the same steps, bit for bit.
  processes, logs = start_two_processes(run_python, straight, tmp_path / 'straight')
  preempt_process_1(processes, logs, straight, after_step=resumed)
  expected = {step: loss for step, loss in losses_by_step(straight).items() if step <= resumed}
  assert losses_by_step(preempted) == expected
  assert sorted(expected) == list(range(1, resumed + 1))
