"""Where a job's hosts and ranks come from: host lists and hostfiles, a Slurm allocation, the pid
files ranks leave behind. Below both the launcher and its elastic part."""
