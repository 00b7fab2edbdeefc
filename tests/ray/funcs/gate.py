"""Hold until the file named by argv[1] exists: a job that keeps its resources until a test releases it."""
import os
import sys
import time

while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print("released")
