"""Does a Python thread keep running while the main thread is blocked in MPI_Comm_accept / MPI_Finalize?"""
import os, sys, threading, time
from mpi4py import MPI
port = MPI.Open_port()
def tick():
    for i in range(3):
        time.sleep(1); print(f"thread alive {i + 1}s into Accept", flush=True)
    print("thread: giving up, os._exit(3)", flush=True); os._exit(3)
threading.Thread(target=tick, daemon=True).start()
MPI.COMM_WORLD.Accept(port)
