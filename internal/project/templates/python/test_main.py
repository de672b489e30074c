import unittest

from main import greet


class GreetTest(unittest.TestCase):
    def test_greet(self):
        self.assertEqual(greet("you"), "Hello, you!")


if __name__ == "__main__":
    unittest.main()
