from turnmesh.cli import main

# Guarded: multiprocessing children (the file readers) import this module too.
if __name__ == "__main__":
    main()
