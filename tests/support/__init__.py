"""What the tests share: fleets, boards, servers, samples and checks that more than one test
module uses. Test modules import from here (`from support.x import y`: tests/ is on sys.path
during the tests, as the folder of the top conftest.py); no test module imports another."""
