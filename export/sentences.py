"""A built-in sentence set for checking reduced-precision graphs (int8, fp16) against fp32.

Mixed lengths, topics and punctuation, so that short and long rows share padded batches.
"""

SENTENCES: tuple[str, ...] = (
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner while people walk by.",
    "How do I reset my password?",
    "Quarterly revenue grew by twelve percent, driven mostly by subscriptions in Europe.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She missed the train, so she took a taxi to the airport.",
    "Is it going to rain tomorrow afternoon?",
    "The committee postponed its decision until more data on the long-term effects was available.",
    "Paris is the capital of France.",
    "Fresh bread smells wonderful in the morning.",
    "The server returned an error: connection reset by peer.",
    "Children were laughing in the park as the sun went down behind the hills.",
    "Please add two cups of flour and stir gently.",
    "Neural networks learn representations from data by gradient descent.",
    "The museum will be closed on Monday for maintenance.",
    "He plays the violin.",
    "After a long negotiation, both parties agreed to a ceasefire that would begin at midnight.",
    "Where can I buy a cheap ticket for the concert?",
    "The river flooded the village after three days of heavy rain.",
    "I really enjoyed that movie, especially the ending!",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The new phone has a faster processor and a better camera than last year's model.",
    "Dogs are loyal animals.",
    "Our flight was delayed by four hours because of a technical problem with the engine.",
    "Can you recommend a good book about the history of mathematics?",
    "The stock market fell sharply after the announcement.",
    "A woman is slicing vegetables in the kitchen.",
    "Thank you for your help yesterday.",
    "The algorithm sorts the list in O(n log n) time using a divide-and-conquer strategy.",
    "Snow covered the mountains, and the roads were closed for the whole weekend.",
    "What time does the library open?",
    "The orchestra performed Beethoven's ninth symphony to a standing ovation.",
)
